"""Received gossip is handled by the task that read it (p2p.gossip.pubsub.LeanPubsub), not a service task per
message: everything arrives, in order, and a message whose handling fails ends only its sender's stream and costs
that sender, while the node's pubsub goes on."""

from __future__ import annotations

import trio

from tests.p2p.test_p2p_gossip import LIMIT, UNLIMITED, peers, wait_mesh


async def test_messages_are_handled_in_line_and_in_order():
    with trio.fail_after(LIMIT):
        async with peers(2, UNLIMITED) as (a, b):
            started = []
            run_task = b.pubsub.manager.run_task
            b.pubsub.manager.run_task = lambda fn, *args, **kw: started.append(fn.__name__) or run_task(fn, *args, **kw)
            inbox = b.subscribe("vote")
            await wait_mesh([a, b], "vote")
            for i in range(20):
                await a.publish("vote", {"n": i})
            got = [(await inbox.receive()).body["n"] for _ in range(20)]
            assert got == list(range(20))
            assert "push_msg" not in started  # py-libp2p's loop starts one task per message: 20 here


async def test_a_message_that_breaks_its_handling_costs_its_sender_not_the_node():
    with trio.fail_after(LIMIT):
        async with peers(3, UNLIMITED) as (a, b, c):  # a - b - c
            faults: list[str] = []
            b.host.fault_listeners.append(lambda peer, protocol: faults.append(peer))
            inbox = b.subscribe("vote")
            await wait_mesh([a, b, c], "vote")
            push = b.pubsub.push_msg

            async def breaks_once(forwarder, msg):
                b.pubsub.push_msg = push
                raise RuntimeError("a bug this message triggers")

            b.pubsub.push_msg = breaks_once
            await a.publish("vote", {"n": 1})
            while not faults:
                await trio.sleep(0.05)
            assert faults == [a.host.peer_id]  # a's stream was reset and a penalised
            assert b.pubsub.manager.is_running  # the service did not die with the message
            await c.publish("vote", {"n": 2})  # and b goes on hearing its other peers
            assert (await inbox.receive()).body["n"] == 2
