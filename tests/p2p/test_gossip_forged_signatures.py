"""What a peer's pubsub RPCs make py-libp2p do before any of our bounds, against real hosts on loopback: a message
whose pubsub signature does not verify (py-libp2p drops it before our checks) still costs the peer that handed it
over, as any forgery does, up to a ban; a peer's signed record is checked once per stream, however many RPCs carry
it; the peers a PRUNE names are not dialed; a PRUNE for a topic we are not in leaves no state. Every wait is
bounded."""

from __future__ import annotations

import os
from contextlib import AsyncExitStack

import trio
from libp2p.peer.id import ID
from libp2p.peer.peerstore import env_to_send_in_RPC
from libp2p.pubsub.pb import rpc_pb2
from libp2p.utils.varint import encode_varint_prefixed as varint_prefixed

from p2p.gossip.service import topic_for
from p2p.host.p2p_host import HostConfig, open_host
from p2p.identity import Identity
from tests.p2p.gossip_nodes import meshed_nodes

RUN = "run-forged"
LIMIT = 30


async def test_a_peer_sending_messages_with_forged_pubsub_signatures_is_scored_and_banned():
    with trio.fail_after(LIMIT):
        async with AsyncExitStack() as stack:
            target, mallory, witness = await meshed_nodes(stack, RUN, 90, 3)
            target_id, bad = ID.from_base58(target.host.peer_id), ID.from_base58(mallory.host.peer_id)
            rpc = rpc_pb2.RPC()
            for _ in range(4):  # signed by nobody: random bytes where mallory's signature belongs
                rpc.publish.append(rpc_pb2.Message(from_id=bad.to_bytes(), data=b"\x00" * 64, seqno=os.urandom(8),
                                                   topicIDs=[topic_for(RUN, "heartbeat")], signature=os.urandom(64)))
            await mallory.pubsub.write_msg(mallory.pubsub.peers[target_id], rpc)
            with trio.move_on_after(5):
                while target.stats.bans == 0:
                    await trio.sleep(0.01)
            assert target.stats.rejected["bad_signature"] == 4 and target.stats.bans == 1
            assert target.scores.is_banned(mallory.host.peer_id, trio.current_time())
            inbox = target.subscribe("heartbeat")
            await witness.publish("heartbeat", {"roles": ["seed"]})
            assert (await inbox.receive()).sender_peer_id == witness.host.peer_id


async def test_a_peer_attaching_its_signed_record_to_every_rpc_has_it_checked_once_per_stream(monkeypatch):
    """A valid record costs its sender nothing and each check of it a signature check: only the stream's first one
    is read."""
    import p2p.gossip.pubsub as lean

    checked: list[str] = []

    def counting(rpc, host, peer_id):
        if rpc.HasField("senderRecord"):
            checked.append(str(peer_id))
        return consume(rpc, host, peer_id)

    consume = lean.maybe_consume_signed_record
    monkeypatch.setattr(lean, "maybe_consume_signed_record", counting)
    with trio.fail_after(LIMIT):
        async with AsyncExitStack() as stack:
            target, mallory = await meshed_nodes(stack, RUN, 95, 2)
            record, _ = env_to_send_in_RPC(mallory.host.libp2p)
            stream = mallory.pubsub.peers[ID.from_base58(target.host.peer_id)]
            for _ in range(100):
                await stream.write(varint_prefixed(rpc_pb2.RPC(senderRecord=record).SerializeToString()))
            inbox = target.subscribe("heartbeat")  # the stream is read in order: this comes after all 100
            await mallory.publish("heartbeat", {"roles": ["seed"]})
            await inbox.receive()
            assert checked.count(mallory.host.peer_id) <= 1


async def test_a_prune_naming_peers_to_exchange_makes_us_dial_none_of_them():
    """Peer exchange would have us check a signed record and dial each peer a PRUNE names (16 per PRUNE, any
    addresses, ids free): our peers never send it, so none is taken."""
    with trio.fail_after(LIMIT):
        async with AsyncExitStack() as stack:
            target, mallory = await meshed_nodes(stack, RUN, 97, 2)
            decoy = await stack.enter_async_context(open_host(HostConfig(identity=Identity(bytes([99]) * 32))))
            record, _ = env_to_send_in_RPC(decoy.libp2p)
            px = rpc_pb2.PeerInfo(peerID=ID.from_base58(decoy.peer_id).to_bytes(), signedPeerRecord=record)
            prune = rpc_pb2.ControlPrune(topicID=topic_for(RUN, "vote"), peers=[px])
            stream = mallory.pubsub.peers[ID.from_base58(target.host.peer_id)]
            await stream.write(varint_prefixed(rpc_pb2.RPC(control=rpc_pb2.ControlMessage(prune=[prune]))
                                               .SerializeToString()))
            inbox = target.subscribe("heartbeat")  # the stream is read in order: this comes after the PRUNE
            await _heard(mallory, inbox)
            assert ID.from_base58(decoy.peer_id) not in target.host.libp2p.get_connected_peers()


async def test_prunes_for_topics_we_are_not_in_leave_no_state_behind():
    """py-libp2p kept a back-off entry for every topic a PRUNE named, subscribed or not, until that topic was
    grafted again (never, for a made-up one), and after its sender left: memory without end, one entry per name."""
    with trio.fail_after(LIMIT):
        async with AsyncExitStack() as stack:
            target, mallory = await meshed_nodes(stack, RUN, 100, 2)
            router = target.pubsub.router
            before = sum(map(len, router.back_off.values()))
            prunes = [rpc_pb2.ControlPrune(topicID=f"made-up-{i}", backoff=2**40) for i in range(2000)]
            stream = mallory.pubsub.peers[ID.from_base58(target.host.peer_id)]
            await stream.write(varint_prefixed(rpc_pb2.RPC(control=rpc_pb2.ControlMessage(prune=prunes))
                                               .SerializeToString()))
            inbox = target.subscribe("heartbeat")  # the stream is read in order: this comes after the PRUNEs
            await _heard(mallory, inbox)
            assert sum(map(len, router.back_off.values())) == before
            assert not any(topic.startswith("made-up") for topic in router.graft_flood_tracking.get(
                ID.from_base58(mallory.host.peer_id), {}))


async def _heard(sender, inbox, tries: int = 10) -> None:
    """Publish a heartbeat until `inbox` hears one: a loaded machine may let the mesh lose the first to a heartbeat
    round of its own."""
    for attempt in range(tries):
        await sender.publish("heartbeat", {"roles": ["seed"], "attempt": attempt})
        with trio.move_on_after(2):
            await inbox.receive()
            return
    raise AssertionError("no heartbeat was heard")
