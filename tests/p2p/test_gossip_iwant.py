"""What a peer's IWANT requests make a node send, against real py-libp2p hosts on loopback: each message it asks
for at most once per request and a few times in all, however often its ids repeat. py-libp2p copied a message into
the answer once per time its id was named, so one IWANT of 1 MiB naming a 900 KiB rollout ten thousand times built
an answer of gigabytes. Every wait is bounded."""

from __future__ import annotations

from contextlib import AsyncExitStack

import trio
from libp2p.peer.id import ID
from libp2p.pubsub.pb import rpc_pb2
from libp2p.utils.varint import encode_varint_prefixed as varint_prefixed

from p2p.gossip.pubsub import IWANT_RETRANSMISSIONS
from tests.p2p.gossip_nodes import meshed_nodes

RUN = "run-iwant"
LIMIT = 30


async def test_a_message_named_many_times_in_iwants_is_sent_at_most_a_few_times():
    with trio.fail_after(LIMIT):
        async with AsyncExitStack() as stack:
            target, mallory = await meshed_nodes(stack, RUN, 80, 2)
            router, bad = target.pubsub.router, ID.from_base58(mallory.host.peer_id)
            sent: list[int] = []
            send_rpc = router.send_rpc

            def counting(peer_id, rpc, *args, **kwargs):
                if peer_id == bad:
                    sent.append(len(rpc.publish))
                return send_rpc(peer_id, rpc, *args, **kwargs)

            router.send_rpc = counting
            inbox = mallory.subscribe("heartbeat")
            await target.publish("heartbeat", {"roles": ["seed"]})
            await inbox.receive()
            mid = next(iter(router.mcache.msgs))
            stream = mallory.pubsub.peers[ID.from_base58(target.host.peer_id)]
            for _ in range(IWANT_RETRANSMISSIONS + 2):
                iwant = rpc_pb2.ControlIWant(messageIDs=[mid] * 1000)
                await stream.write(varint_prefixed(rpc_pb2.RPC(control=rpc_pb2.ControlMessage(iwant=[iwant]))
                                                   .SerializeToString()))
            await target.publish("heartbeat", {"roles": ["seed"]})  # read after the IWANTs: answered by then
            await inbox.receive()
            assert sum(sent) <= IWANT_RETRANSMISSIONS + 2  # the two publishes and the answers
