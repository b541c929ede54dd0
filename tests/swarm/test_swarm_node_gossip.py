"""A node's own gossip on loopback and in isolation: hostile heartbeats, fault injection at each handler, and the
heartbeat dial limit (swarm.node.gossip)."""

from __future__ import annotations

import pytest
import trio

from p2p.identity import Identity
from tests.swarm.test_swarm_nodes import Peer


async def publish_unpaced(gossip, kind: str, body: dict) -> None:
    """Publish as a peer that ignores its own pacing (p2p.gossip.admission.OwnPace) would."""
    from p2p.gossip.service import topic_for

    await gossip.pubsub.publish(topic_for(gossip.run, kind), gossip._seal(kind, body))


async def test_hostile_heartbeats_neither_stop_a_peer_nor_start_a_fetch_per_entry(tmp_path):
    """A heartbeat with `"policies": 7` must not end the peer, nor one listing an id 16 times start 16 fetches
    of it. Mistyped bodies are refused by gossip's validator (scored, not delivered), a
    well-formed one listing an id 16 times starts one fetch, and the peer goes on hearing others."""
    import swarm.node.gossip as node_gossip

    trainer = Identity.generate()
    fetches: list[bytes] = []

    async def counting_fetch(node, peer, manifest_id, fetch):
        fetches.append(manifest_id)
        await trio.sleep(5)  # still in flight while the flood goes on

    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            target = Peer(tmp_path, "target", trainer, heartbeat_every_s=0.2)  # heartbeats from a peer: 10/s at most
            nursery.start_soon(target.run)
            await target.ready.wait()
            mallory = Peer(tmp_path, "mallory", trainer, bootstrap=[target.node.host.multiaddrs[0]],
                           heartbeat_every_s=100.0, peer_silence_s=300.0)  # only the bodies below
            nursery.start_soon(mallory.run)
            await mallory.ready.wait()
            with pytest.MonkeyPatch.context() as patch:
                patch.setattr(node_gossip, "fetch_and_adopt", counting_fetch)
                inbox = target.node.gossip.subscribe("heartbeat")
                rejections = target.node.gossip.rejections
                await target.node.gossip.wait_for_topic_peer(mallory.node.peer_id, "heartbeat")
                await mallory.node.gossip.wait_for_topic_peer(target.node.peer_id, "heartbeat")
                await _until_heard(mallory, inbox)
                for body in ({"policies": 7, "addrs": 5, "roles": "seed"}, {"policies": {"a": 1}, "addrs": None}):
                    await publish_unpaced(mallory.node.gossip, "heartbeat", body)
                    refusal = await rejections.receive()
                    assert (refusal.peer, refusal.reason) == (mallory.node.peer_id, "bad_body")
                    await trio.sleep(0.1)  # within mallory's heartbeat allowance (two per 0.1 s here)
                fake = [1, b"\x01" * 32, False]
                for body in ({"policies": [fake] * 16}, {"roles": ["seed"]}):
                    await publish_unpaced(mallory.node.gossip, "heartbeat", body)
                    await trio.sleep(0.1)
                while True:  # the last, honest body is heard: the peer kept reading
                    env = await inbox.receive()
                    if env.sender_peer_id == mallory.node.peer_id and env.message.roles == ("seed",):
                        break
                assert not target.node.done.is_set() and not target.node.failed
                assert fetches.count(b"\x01" * 32) == 1  # one fetch, however often a heartbeat names the id
                assert len(target.node.fetching) <= node_gossip.MAX_MANIFEST_FETCHES
                assert target.node.gossip.stats.rejected == {"bad_body": 2}
            for peer in (target, mallory):
                peer.stop()


async def _until_heard(sender, inbox) -> None:
    """Publish a well-formed heartbeat (roles `validator`) once a second until the receiver hears one: a pubsub
    stream can still be opening, or be opened again, after both sides list each other on the topic, and a message
    sent before it is up is lost. Then wait for the sender's heartbeat allowance to refill."""
    with trio.fail_after(30):
        while True:
            await publish_unpaced(sender.node.gossip, "heartbeat", {"roles": ["validator"]})
            with trio.move_on_after(1.0):
                while (await inbox.receive()).sender_peer_id != sender.node.peer_id:
                    pass
                break
    await trio.sleep(0.3)


async def test_an_exception_in_any_gossip_handler_drops_one_message_and_the_peer_serves_on(tmp_path, caplog):
    """Fault injection at each of a node's gossip handler boundaries (heartbeats, manifest announcements): a
    RuntimeError raised for a message drops it, costs its sender and logs one line; the node keeps running and
    handles the next message."""
    import swarm.node.gossip as node_gossip

    trainer = Identity.generate()
    handled: list[str] = []
    target = Peer(tmp_path, "target", trainer)
    real_heartbeat, real_manifest = node_gossip.on_heartbeat, node_gossip.on_manifest

    def faulty(kind, real):
        def handle(node, env, *args):
            if node is not target.node:  # both peers run this module; the faults are the target's
                return real(node, env, *args)
            handled.append(kind)
            if handled.count(kind) == 1:
                raise RuntimeError(f"injected fault in the {kind} handler")
            return real(node, env, *args)
        return handle

    with trio.fail_after(60), pytest.MonkeyPatch.context() as patch:
        patch.setattr(node_gossip, "on_heartbeat", faulty("heartbeat", real_heartbeat))
        patch.setattr(node_gossip, "on_manifest", faulty("manifest", real_manifest))
        async with trio.open_nursery() as nursery:
            nursery.start_soon(target.run)
            await target.ready.wait()
            other = Peer(tmp_path, "other", trainer, bootstrap=[target.node.host.multiaddrs[0]])
            nursery.start_soon(other.run)
            await other.ready.wait()
            await other.node.gossip.wait_for_topic_peer(target.node.peer_id, "manifest")
            body = {"id": b"\x07" * 32, "version": 1}
            while handled.count("manifest") < 2 or handled.count("heartbeat") < 2:
                await other.node.gossip.publish("manifest", body)
                await trio.sleep(0.5)
            assert not target.node.done.is_set() and not target.node.failed
            assert target.node.gossip.stats.rejected["handler_error"] == 2
            assert other.node.peer_id in target.node.peer_roles  # the second heartbeat was handled
            for peer in (target, other):
                peer.stop()
    assert sum("injected fault" in r.getMessage() for r in caplog.records) == 2


async def test_throwaway_ids_fill_the_heartbeat_dial_limit_only_for_a_while(autojump_clock):
    """Peers a heartbeat made us dial counted against max_peers for ever, connected or not: a few dozen throwaway
    identities heartbeating once kept every later peer from being dialed."""
    from types import SimpleNamespace

    from swarm.messages.gossip_bodies import Heartbeat
    from swarm.node.gossip import HEARTBEAT_REDIAL_S
    from swarm.node.gossip import on_heartbeat as _on_heartbeat

    started = []
    node = SimpleNamespace(
        peer_id="z" * 52, config=SimpleNamespace(limits=SimpleNamespace(max_peers=4),
                                                mirror=SimpleNamespace(keep_versions=3)), connected_peers=lambda: [],
        heard_from=lambda *args: None, mirror=SimpleNamespace(latest=lambda: None, policies={}),
        nursery=SimpleNamespace(start_soon=lambda fn, node, part, peer, addrs: started.append(peer)))

    def heartbeat(sender):
        beat = Heartbeat((), (f"/ip4/10.0.0.1/tcp/1/p2p/{sender}",), (), ())
        return SimpleNamespace(sender_peer_id=sender, decoded=lambda kind: beat if kind is Heartbeat else None)

    dialed: dict[str, float] = {}
    for i in range(4):
        _on_heartbeat(node, heartbeat(f"throwaway{i}"), dialed, None)
    _on_heartbeat(node, heartbeat("honest"), dialed, None)
    assert started == [f"throwaway{i}" for i in range(4)]  # the limit holds while those dials are fresh
    await trio.sleep(HEARTBEAT_REDIAL_S + 1)
    _on_heartbeat(node, heartbeat("honest"), dialed, None)
    assert started[-1] == "honest" and set(dialed) == {"honest"}


async def test_a_peer_whose_streams_fault_the_host_pays_in_gossip_too_and_three_faults_ban_it_there(tmp_path):
    """One accountability (swarm.node.gossip.share_host_faults): each stream that makes a node's handler fail
    costs its peer gossip score, and the three faults that ban it from the host ban it from gossip as well."""
    from libp2p.network.stream.exceptions import StreamError

    from p2p.errors import HostError
    from p2p.host.p2p_host import open_host

    async def explode(stream):
        raise RuntimeError("injected stream fault")

    target = Peer(tmp_path, "target", Identity.generate())
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery, open_host() as mallory:
            nursery.start_soon(target.run)
            await target.ready.wait()
            target.node.host.set_guarded_handler("/test/fragile/1", explode)
            await mallory.connect(target.node.host.multiaddrs[0])
            gossip = target.node.gossip
            for fault in range(3):
                with pytest.raises((HostError, StreamError)):  # the handler raised: the target reset the stream
                    stream = await mallory.new_stream(target.node.peer_id, "/test/fragile/1")
                    await stream.write(b"x")
                    await stream.read(1)
                refusal = await gossip.rejections.receive()
                assert (refusal.peer, refusal.reason) == (mallory.peer_id, "handler_fault")
                assert refusal.banned == (fault == 2)
            assert mallory.peer_id in gossip.banned_peers()
            assert not target.node.done.is_set() and not target.node.failed
            target.stop()
