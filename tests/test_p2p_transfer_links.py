"""The trio adapter's links on a virtual clock: channel errors, links arriving at any time, silent peers, the
router, a full disk, links served in the caller's task, and bursts of small frames."""

from __future__ import annotations

import pytest
import trio

from p2p.memnet import MemoryNetwork
from p2p.pieces.engine import EngineConfig
from p2p.pieces.store import PieceStore
from p2p.pieces.transfer import SwarmService, TransferConfig
from p2p.pieces.wire import Hello, message_frame, pack_bits
from p2p.ratelimit import TokenBucket
from tests.test_p2p_transfer import MB, Cluster, make_policy


class _TamperedChannel:
    """A memnet stream whose reads fail like an encrypted channel that detected tampering (p2p/channel_stream)."""

    def __init__(self, inner, fail_after_bytes):
        self.inner, self.left = inner, fail_after_bytes

    async def send_all(self, data):
        await self.inner.send_all(data)

    async def receive_some(self, max_bytes=None):
        from p2p.errors import ChannelTamperedError

        data = await self.inner.receive_some(max_bytes)
        self.left -= len(data)
        if self.left < 0:
            raise ChannelTamperedError("record tampered")
        return data

    async def aclose(self):
        await self.inner.aclose()


async def test_a_channel_error_drops_only_that_link(tmp_path, autojump_clock):
    manifest = make_policy(tmp_path / "src", 1 * MB)
    async with trio.open_nursery() as nursery:
        c = Cluster(tmp_path, nursery, manifest, tmp_path / "src")
        await c.add("seed", seed_from=tmp_path / "src")
        await c.add("s2", seed_from=tmp_path / "src")
        node = await c.add("p0")
        mine, theirs = c.net.connect("p0", "seed")
        node.add_link("seed", _TamperedChannel(mine, 300_000))
        c.services["seed"].add_link("p0", theirs)
        with trio.fail_after(30):
            while "seed" not in node.drops:
                await trio.sleep(0.1)
            c.link("s2", "p0")
            await node.completed.wait()
        nursery.cancel_scope.cancel()
    assert node.drops["seed"] == "its data channel carried forged or tampered bytes: record tampered"
    assert node.banned == {"seed"}
    c.assert_identical("p0")
    c.close()


async def test_run_swarm_takes_links_from_a_channel_at_any_time(tmp_path, autojump_clock):
    from p2p.pieces.transfer import run_swarm

    manifest = make_policy(tmp_path / "src", 1 * MB)
    net = MemoryNetwork(latency=0.01)
    for name in ("seed", "p0"):
        net.add_node(name, upload_bps=MB)
    seed_store, peer_store = PieceStore(tmp_path / "seed"), PieceStore(tmp_path / "p0")
    seed_store.add_local_policy(manifest, tmp_path / "src")
    seed_in, seed_links = trio.open_memory_channel(0)
    peer_in, peer_links = trio.open_memory_channel(0)
    async with trio.open_nursery() as nursery:
        seed = await nursery.start(lambda task_status: run_swarm(
            manifest, seed_store, seed_links, role="origin", upload_bucket=TokenBucket(MB), task_status=task_status))
        peer = await nursery.start(lambda task_status: run_swarm(
            manifest, peer_store, peer_links, task_status=task_status))
        assert seed.config.engine.super_seed and not peer.config.engine.super_seed
        await trio.sleep(30)  # the link arrives long after both services started
        a, b = net.connect("seed", "p0")
        await seed_in.send(("p0", a))
        await peer_in.send(("seed", b))
        with trio.fail_after(30):
            await peer.completed.wait()
        nursery.cancel_scope.cancel()
    assert peer_store.is_complete(manifest)
    seed_store.close()
    peer_store.close()


async def _silent_holder(stream, manifest):
    """Claims every piece, reads requests, never answers them."""
    for part in message_frame(Hello(manifest.id, pack_bits([1] * manifest.num_pieces))):
        await stream.send_all(part)
    while await stream.receive_some(65536):
        pass


async def test_requests_to_a_silent_peer_time_out_and_go_elsewhere(tmp_path, autojump_clock):
    manifest = make_policy(tmp_path / "src", 1 * MB)
    cfg = TransferConfig(engine=EngineConfig(request_timeout=5, stall_timeout=20, endgame=False), tick_interval=1)
    async with trio.open_nursery() as nursery:
        c = Cluster(tmp_path, nursery, manifest, tmp_path / "src")
        node = await c.add("p0", config=cfg)
        c.net.add_node("mute")
        mine, theirs = c.net.connect("p0", "mute")
        node.add_link("mute", mine)
        nursery.start_soon(_silent_holder, theirs, manifest)
        await trio.sleep(1)
        await c.add("seed", seed_from=tmp_path / "src", upload_bps=MB)
        c.link("seed", "p0")
        with trio.fail_after(60):
            await node.completed.wait()
        done_at = trio.current_time()
        timed_out = int(node.engine.peers["mute"].timed_out.sum())
        nursery.cancel_scope.cancel()
    assert done_at < 15  # re-issued after the 5 s request timeout, not stuck on the silent peer
    assert timed_out == manifest.num_pieces  # it was asked for every piece; each request was cancelled and moved
    c.assert_identical("p0")
    c.close()


async def test_router_hands_inbound_links_to_the_service_of_their_manifest(tmp_path, autojump_clock):
    from p2p.pieces.router import SwarmRouter

    v1 = make_policy(tmp_path / "v1", 1 * MB, seed=1)
    v2 = make_policy(tmp_path / "v2", 1 * MB, seed=2)
    net = MemoryNetwork(latency=0.01)
    for name in ("seed", "a", "b", "x"):
        net.add_node(name)
    seed_store = PieceStore(tmp_path / "seed")
    seed_store.add_local_policy(v1, tmp_path / "v1")
    seed_store.add_local_policy(v2, tmp_path / "v2")
    stores = {"a": PieceStore(tmp_path / "a"), "b": PieceStore(tmp_path / "b")}
    router = SwarmRouter()
    async with trio.open_nursery() as nursery:
        for m in (v1, v2):
            router.register(await nursery.start(SwarmService(m, seed_store).run))
        fetchers = {"a": SwarmService(v1, stores["a"]), "b": SwarmService(v2, stores["b"])}
        for name, service in fetchers.items():
            await nursery.start(service.run)
            mine, theirs = net.connect(name, "seed")
            service.add_link("seed", mine)  # the dialer speaks first; the router reads its hello
            assert await router.accept(name, theirs)
        stranger, theirs = net.connect("x", "seed")
        for part in message_frame(Hello(b"\x09" * 32, b"")):
            await stranger.send_all(part)
        assert not await router.accept("x", theirs)
        assert await stranger.receive_some(100) == b""  # closed without touching any service
        with trio.fail_after(30):
            for service in fetchers.values():
                await service.completed.wait()
        nursery.cancel_scope.cancel()
    assert stores["a"].is_complete(v1) and stores["b"].is_complete(v2)
    assert not stores["a"].manifest(v2.id)
    for st in (seed_store, *stores.values()):
        st.close()


async def test_a_full_disk_ends_the_service_with_one_clear_error(tmp_path, autojump_clock, monkeypatch):
    import errno
    import os

    from p2p.errors import DiskFullError
    from p2p.pieces import store as store_mod

    manifest = make_policy(tmp_path / "src", 1 * MB)

    def no_space(*_a, **_k):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    c = None
    with pytest.raises(ExceptionGroup) as info:  # the group of this test's own nursery
        async with trio.open_nursery() as nursery:
            c = Cluster(tmp_path, nursery, manifest, tmp_path / "src")
            await c.add("seed", seed_from=tmp_path / "src")
            await c.add("p0")
            monkeypatch.setattr(store_mod.os, "pwrite", no_space)
            c.link("seed", "p0")
            await trio.sleep(60)
    monkeypatch.undo()
    [error] = info.value.exceptions
    assert isinstance(error, DiskFullError) and "disk is full" in str(error)  # the service raised it bare
    assert not any(c.stores["p0"].bitfield(manifest))  # nothing half-written is trusted
    c.close()


async def test_serve_link_runs_a_link_in_the_callers_task(tmp_path, autojump_clock):
    manifest = make_policy(tmp_path / "src", 1 * MB)
    async with trio.open_nursery() as nursery:
        c = Cluster(tmp_path, nursery, manifest, tmp_path / "src")
        seed = await c.add("seed", seed_from=tmp_path / "src")
        node = await c.add("p0")
        mine, theirs = c.net.connect("p0", "seed")
        seed.add_link("p0", theirs)
        nursery.start_soon(node.serve_link, "seed", mine)
        with trio.fail_after(30):
            await node.completed.wait()
        assert node.peers == ["seed"]
        c.leave("seed")  # the link ends when the peer goes; serve_link returns without raising
        with trio.fail_after(30):
            while node.peers:
                await trio.sleep(0.1)
        nursery.cancel_scope.cancel()
    c.assert_identical("p0")
    c.close()


async def test_a_link_served_in_the_callers_task_ends_when_its_service_stops(tmp_path, autojump_clock):
    """An inbound link runs in the acceptor's task, not the service's nursery; when a mirror drops the version (its
    service stops and its pieces are deleted) that link must end too, not keep answering from deleted files. A link
    offered to the stopped service is closed at once."""
    manifest = make_policy(tmp_path / "src", 1 * MB)
    async with trio.open_nursery() as nursery:
        c = Cluster(tmp_path, nursery, manifest, tmp_path / "src")
        seed = await c.add("seed", seed_from=tmp_path / "src")
        for name in ("p0", "p1"):
            c.net.add_node(name)
        mine, theirs = c.net.connect("seed", "p0")  # p0 never says hello: the link waits in its handshake
        ended = trio.Event()

        async def serve():
            await seed.serve_link("p0", mine)
            ended.set()

        nursery.start_soon(serve)
        await trio.sleep(1.0)
        assert seed.peers == ["p0"]
        c.scopes["seed"].cancel()
        with trio.fail_after(1.0):  # well before the 10 s handshake timeout
            await ended.wait()
        assert seed.peers == []
        late, _ = c.net.connect("seed", "p1")
        with trio.fail_after(1.0):
            await seed.serve_link("p1", late)  # refused at once: the service has stopped
        assert seed.peers == []
        nursery.cancel_scope.cancel()
    c.close()


async def test_a_link_that_arrives_after_the_service_stopped_is_refused_not_a_crash(tmp_path, autojump_clock):
    """A dial that completes while the node shuts down: add_link says no (the caller closes the stream) instead of
    raising into a closed nursery, and the router closes such a link itself."""
    from p2p.pieces.router import SwarmRouter

    v1 = make_policy(tmp_path / "v1", 1 * MB, seed=1)
    store = PieceStore(tmp_path / "seed")
    store.add_local_policy(v1, tmp_path / "v1")
    service = SwarmService(v1, store)
    router = SwarmRouter()
    async with trio.open_nursery() as nursery:
        router.register(await nursery.start(service.run))
        nursery.cancel_scope.cancel()
    net = MemoryNetwork()
    net.add_node("a")
    net.add_node("seed")
    mine, theirs = net.connect("a", "seed")
    assert service.add_link("a", theirs) is False
    for part in message_frame(Hello(v1.id, b"")):
        await mine.send_all(part)
    assert not await router.accept("a", theirs)
    assert await mine.receive_some(100) == b""  # closed


async def test_a_burst_of_small_frames_does_not_hold_the_node_until_it_is_read(tmp_path, autojump_clock):
    """Frames already buffered were decoded without yielding: a peer sending thousands of small frames at once held
    every other task of the node (other links, timers, gossip) until all were handled."""
    from p2p.pieces.transfer import FRAMES_PER_CHECKPOINT
    from p2p.pieces.wire import Have

    manifest = make_policy(tmp_path / "src", 1 * MB)
    async with trio.open_nursery() as nursery:
        c = Cluster(tmp_path, nursery, manifest, tmp_path / "src")
        node = await c.add("p0")
        seen, first, handled_when_another_task_ran = [], trio.Event(), []

        async def another_task():
            await first.wait()  # runnable from the burst's first frame on: it runs at the receiver's next yield
            handled_when_another_task_ran.append(len(seen))

        honest_have = node.engine.peer_have
        node.engine.peer_have = lambda *args: (seen.append(1), first.set(), honest_have(*args))[2]
        nursery.start_soon(another_task)
        c.net.add_node("chatty")
        mine, theirs = c.net.connect("p0", "chatty")
        node.add_link("chatty", mine)
        burst = b"".join(message_frame(Hello(manifest.id, pack_bits([0] * manifest.num_pieces))))
        burst += b"".join(part for _ in range(2000) for part in message_frame(Have(0)))
        await theirs.send_all(burst)
        while len(seen) < 2000:
            await trio.sleep(0.01)
        nursery.cancel_scope.cancel()
    # by the second yield at the latest (trio may run the receiver first in the batch after its first yield)
    assert handled_when_another_task_ran and handled_when_another_task_ran[0] < 2 * FRAMES_PER_CHECKPOINT
    c.close()
