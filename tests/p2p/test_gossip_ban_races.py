"""Bans and hang-ups on one peer, run twice and in either order, against real py-libp2p hosts on loopback: the
pubsub service of the banning node keeps running and keeps serving its other peers, and a banned peer leaves no
pubsub state behind (its outbound queue, its sending task, its router entry). Every wait is bounded."""

from __future__ import annotations

from contextlib import AsyncExitStack

import pytest
import trio
from libp2p.peer.id import ID

from p2p.gossip.service import Gossip, open_gossip, topic_for
from p2p.host.p2p_host import HostConfig, open_host
from p2p.identity import Identity
from swarm.bench.gossip_flood import heartbeat_envelope
from tests.p2p.gossip_nodes import meshed_nodes

RUN = "run-ban-race"
LIMIT = 30


async def _star(stack: AsyncExitStack) -> tuple[Gossip, Gossip, Gossip]:
    """target in the middle, connected to mallory and to an honest witness, all three meshed on heartbeats."""
    target, mallory, witness = await meshed_nodes(stack, RUN, 70, 3)
    return target, mallory, witness


def _ban(target: Gossip, peer: Gossip):
    peer_id = ID.from_base58(peer.host.peer_id)
    return lambda: target.penalties._ban(peer.host.peer_id, peer_id)


def _hang_up(target: Gossip, peer: Gossip):
    return lambda: target._nursery.start_soon(target.host.disconnect, peer.host.peer_id)


def _fault_ban(target: Gossip, peer: Gossip):
    return lambda: target.host.nursery.start_soon(target.host._disconnect, peer.host.peer_id)


ORDERS = {
    "ban_then_hang_up": (_ban, _hang_up, _ban, _hang_up),
    "hang_up_then_ban": (_hang_up, _ban, _hang_up, _ban),
    "ban_host_fault_ban": (_ban, _fault_ban, _fault_ban, _ban),
}


@pytest.mark.parametrize("order", sorted(ORDERS))
async def test_banning_and_hanging_up_on_one_peer_twice_in_any_order_keeps_pubsub_running(order):
    with trio.fail_after(LIMIT):
        async with AsyncExitStack() as stack:
            target, mallory, witness = await _star(stack)
            bad = ID.from_base58(mallory.host.peer_id)
            for step in ORDERS[order]:
                step(target, mallory)()
            while bad in target.pubsub.peers or bad in target.host.libp2p.get_connected_peers():
                await trio.sleep(0.01)
            for _ in range(20):  # let every teardown task that was started run to its end
                await trio.sleep(0.01)
            assert target.pubsub.manager.is_running
            assert target.stats.bans == (1 if _ban in ORDERS[order] else 0)  # one ban, however often it is run
            assert bad not in target.pubsub.peer_queues and bad not in target.pubsub.router.peer_protocol
            inbox = witness.subscribe("heartbeat")
            await target.publish("heartbeat", {"roles": ["seed"]})
            assert (await inbox.receive()).sender_peer_id == target.host.peer_id



async def test_a_peer_banned_while_its_pubsub_stream_opens_is_not_left_registered():
    """py-libp2p reads the blacklist before it opens a peer's stream and registers the peer after: a ban landing
    in between must still tear the peer down."""
    with trio.fail_after(LIMIT):
        async with AsyncExitStack() as stack:
            target, mallory, _ = await _star(stack)
            bad = ID.from_base58(mallory.host.peer_id)
            await target.host.disconnect(mallory.host.peer_id)
            while bad in target.pubsub.peers:
                await trio.sleep(0.01)
            libp2p, opened = target.pubsub.host, trio.Event()
            new_stream = libp2p.new_stream

            async def banned_while_opening(peer_id, protocols):
                stream = await new_stream(peer_id, protocols)
                if peer_id == bad:
                    target.pubsub.blacklisted_peers.add(bad)
                    opened.set()
                return stream

            libp2p.new_stream = banned_while_opening
            await target.host.connect(mallory.host.multiaddrs[0])
            await opened.wait()
            for _ in range(20):
                await trio.sleep(0.01)
            assert bad not in target.pubsub.peers and bad not in target.pubsub.peer_queues


async def test_a_crowd_of_fresh_identities_flooding_until_banned_leaves_the_target_serving():
    """Fresh identities, one after another, each connects and floods valid heartbeats until it is banned (banned
    and hung up on at once): the target's pubsub keeps running, keeps no state of the banned, and still delivers."""
    with trio.fail_after(2 * LIMIT):
        async with AsyncExitStack() as stack:
            target, first, witness = await _star(stack)
            crowd = [first]
            for i in range(5):
                host = await stack.enter_async_context(open_host(HostConfig(identity=Identity(bytes([110 + i]) * 32))))
                crowd.append(await stack.enter_async_context(open_gossip(host, RUN)))
            topic = topic_for(RUN, "heartbeat")
            for mallory in crowd:
                if mallory is not first:
                    await mallory.host.connect(target.host.multiaddrs[0])
                    await mallory.wait_for_mesh(target.host.peer_id, "heartbeat")
                mallory.pubsub.remove_topic_validator(topic)
                for seq in range(40):  # a burst of valid heartbeats, far past one peer's rate
                    await mallory.pubsub.publish(topic, heartbeat_envelope(RUN, mallory.identity, mallory.clock(),
                                                                           1_000 + seq))
                while mallory.host.peer_id not in target.banned_peers():
                    await trio.sleep(0.05)
            assert target.stats.bans == len(crowd)
            for _ in range(20):
                await trio.sleep(0.01)
            assert target.pubsub.manager.is_running
            honest = {ID.from_base58(witness.host.peer_id)}
            assert set(target.pubsub.peers) == set(target.pubsub.peer_queues) == honest
            assert set(target.pubsub.router.peer_protocol) == honest
            inbox = witness.subscribe("heartbeat")
            await target.publish("heartbeat", {"roles": ["seed"]})
            assert (await inbox.receive()).sender_peer_id == target.host.peer_id
