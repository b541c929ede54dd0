"""The trio adapter over memnet on a virtual clock: whole swarms, hostile peers, and the Kumar-Ross bound."""

from __future__ import annotations

import math
import random
import shutil

import numpy as np
import pytest
import trio
from safetensors.numpy import save_file

from p2p.memnet import MemoryNetwork
from p2p.pieces.engine import EngineConfig
from p2p.pieces.manifest import MIN_PIECE_SIZE, GenerationSettings, build_manifest
from p2p.pieces.store import PieceStore
from p2p.pieces.transfer import SwarmService, TransferConfig
from p2p.pieces.wire import FrameDecoder, Hello, encode_frame, message_frame, pack_bits, read_frame
from swarm.bench.kumar_ross import min_distribution_time

GEN = GenerationSettings(group_size=4, temperature=0.6, max_new_tokens=64, stage=0)
MB = 1 << 20


def make_policy(path, total_bytes, seed=0):
    """A policy of random float32 weights split over two safetensors files, and its manifest."""
    path.mkdir(parents=True)
    rng = np.random.default_rng(seed)
    n = total_bytes // 4
    save_file({"a": rng.standard_normal(n * 3 // 4, dtype=np.float32)}, str(path / "model-00001.safetensors"))
    save_file({"b": rng.standard_normal(n // 4, dtype=np.float32)}, str(path / "model-00002.safetensors"))
    (path / "model.json").write_text('{"arch": "test"}')
    return build_manifest(path, run="r", version=1, parent_version=None, created_at=0.0, generation=GEN,
                          piece_size=MIN_PIECE_SIZE)


class Cluster:
    """Nodes of one swarm on a memnet, each a SwarmService over its own PieceStore."""

    def __init__(self, tmp_path, nursery, manifest, src, latency=0.01, chunk=32 * 1024):
        self.tmp, self.nursery, self.manifest, self.src = tmp_path, nursery, manifest, src
        self.net = MemoryNetwork(latency=latency, chunk=chunk)
        self.services: dict[str, SwarmService] = {}
        self.stores: dict[str, PieceStore] = {}
        self.scopes: dict[str, trio.CancelScope] = {}

    async def add(self, name, *, seed_from=None, upload_bps=math.inf, config=TransferConfig()):
        self.net.add_node(name, upload_bps=upload_bps)
        store = PieceStore(self.tmp / "nodes" / name)
        if seed_from is not None:
            store.add_local_policy(self.manifest, seed_from)
        self.stores[name] = store
        service = SwarmService(self.manifest, store, config=config, rng=random.Random(name))
        self.services[name] = service

        async def run(task_status=trio.TASK_STATUS_IGNORED):
            with trio.CancelScope() as scope:
                self.scopes[name] = scope
                await service.run(task_status=task_status)

        await self.nursery.start(run)
        return service

    def link(self, a, b):
        sa, sb = self.net.connect(a, b)
        self.services[a].add_link(b, sa)
        self.services[b].add_link(a, sb)

    async def fetch_all(self, sources, peers, timeout=120):
        """Add `peers` (1 MiB/s upload each), link them with each other and `sources`, wait until all complete."""
        for p in peers:
            await self.add(p, upload_bps=1 * MB)
        self.link_all([*sources, *peers])
        with trio.fail_after(timeout):
            for p in peers:
                await self.services[p].completed.wait()

    def link_all(self, names):
        for i, a in enumerate(names):
            for b in names[i + 1 :]:
                self.link(a, b)

    def leave(self, name):
        self.scopes[name].cancel()
        self.net.nodes[name].disconnect()

    def assert_identical(self, name):
        out = self.stores[name].reassemble(self.manifest, self.tmp / "out" / name)
        for f in self.manifest.files:
            assert (out / f.name).read_bytes() == (self.src / f.name).read_bytes()

    def close(self):
        for store in self.stores.values():
            store.close()


async def test_one_seed_and_many_peers_all_complete_byte_identical(tmp_path, autojump_clock):
    manifest = make_policy(tmp_path / "src", 3 * MB)
    done = []
    async with trio.open_nursery() as nursery:
        c = Cluster(tmp_path, nursery, manifest, tmp_path / "src")
        await c.add("seed", seed_from=tmp_path / "src", upload_bps=2 * MB)
        peers = [f"p{i}" for i in range(5)]
        for p in peers:
            await c.add(p, upload_bps=2 * MB)
        c.services["p0"].on_progress = lambda prog: done.append(prog.pieces_done)
        c.link_all(["seed"] + peers)
        with trio.fail_after(60):
            for p in peers:
                await c.services[p].completed.wait()
        nursery.cancel_scope.cancel()
    for p in peers:
        c.assert_identical(p)
    assert done == sorted(done) and done[-1] == manifest.num_pieces  # progress reports every piece, in order
    up = {p: sum(c.services[p].progress().bytes_up.values()) for p in peers}
    assert sum(up.values()) > manifest.total_size  # peers re-seed to each other, not only the seed uploads
    c.close()


async def test_seed_leaves_after_first_copy_and_a_late_peer_completes(tmp_path, autojump_clock):
    manifest = make_policy(tmp_path / "src", 2 * MB)
    seed_cfg = TransferConfig(engine=EngineConfig(super_seed=True))
    async with trio.open_nursery() as nursery:
        c = Cluster(tmp_path, nursery, manifest, tmp_path / "src")
        await c.add("seed", seed_from=tmp_path / "src", upload_bps=1 * MB, config=seed_cfg)
        peers = ["p0", "p1", "p2"]
        for p in peers:
            await c.add(p, upload_bps=1 * MB)
        c.link_all(["seed"] + peers)
        with trio.fail_after(60):
            while not all(any(c.services[p].engine.have[i] for p in peers) for i in range(manifest.num_pieces)):
                await trio.sleep(0.05)  # until the peers together hold the first full copy
        assert not all(c.services[p].completed.is_set() for p in peers)  # the seed leaves early, not at the end
        c.leave("seed")
        with trio.fail_after(60):
            for p in peers:
                await c.services[p].completed.wait()
        await c.add("late", upload_bps=1 * MB)
        for p in peers:
            c.link("late", p)
        with trio.fail_after(60):
            await c.services["late"].completed.wait()
        nursery.cancel_scope.cancel()
    for p in peers + ["late"]:
        c.assert_identical(p)
    c.close()


async def test_a_peer_serving_corrupt_pieces_is_dropped_and_the_others_complete(tmp_path, autojump_clock):
    manifest = make_policy(tmp_path / "src", 2 * MB)
    async with trio.open_nursery() as nursery:
        c = Cluster(tmp_path, nursery, manifest, tmp_path / "src")
        liar = await c.add("bad", seed_from=tmp_path / "src", upload_bps=8 * MB)
        honest_read = c.stores["bad"].read_piece
        # a hostile peer: whatever its store holds, it sends pieces of the right size with flipped bytes
        c.stores["bad"].read_piece = lambda m, i: bytes(b ^ 0xFF for b in honest_read(m, i))
        assert liar.store is c.stores["bad"]
        await c.add("seed", seed_from=tmp_path / "src", upload_bps=1 * MB)
        peers = ["p0", "p1", "p2"]
        await c.fetch_all(["bad", "seed"], peers)
        mine, theirs = c.net.connect("p0", "bad")  # the liar links again: closed at once, never served
        await c.services["p0"].serve_link("bad", mine)
        assert await theirs.receive_some(1 << 16) == b""  # closed without even a hello
        nursery.cancel_scope.cancel()
    for p in peers:
        c.assert_identical(p)
        assert "corrupt" in c.services[p].drops.get("bad", "") and c.services[p].banned == {"bad"}
    c.close()


async def test_an_honest_peer_whose_file_went_bad_on_disk_refuses_those_pieces_and_is_not_dropped(tmp_path,
                                                                                                    autojump_clock):
    """A seed trusts a complete file by its size at start; if its bytes change on disk, serving them would get it
    dropped as a liar by every receiver while the bad bytes went on being offered. Each piece is hashed on its
    first read: the bad ones are refused (the receivers fetch them elsewhere) and the seed stays linked."""
    manifest = make_policy(tmp_path / "src", 2 * MB)
    rotten = tmp_path / "rotten"
    shutil.copytree(tmp_path / "src", rotten)
    first = manifest.files[0]
    data = bytearray((rotten / first.name).read_bytes())
    data[first.piece_size + 7] ^= 0x01  # one bit of the file's second piece
    (rotten / first.name).write_bytes(bytes(data))
    bad_index = next(p.index for p in manifest.pieces if p.file is first and p.local_index == 1)
    async with trio.open_nursery() as nursery:
        c = Cluster(tmp_path, nursery, manifest, tmp_path / "src")
        rotten_seed = await c.add("rotten", seed_from=rotten, upload_bps=8 * MB)
        await c.add("seed", seed_from=tmp_path / "src", upload_bps=1 * MB)
        peers = ["p0", "p1"]
        await c.fetch_all(["rotten", "seed"], peers)
        assert rotten_seed.corrupt_pieces == {bad_index}
        assert all("rotten" in c.services[p].peers and "rotten" not in c.services[p].drops for p in peers)
        nursery.cancel_scope.cancel()
    for p in peers:
        c.assert_identical(p)
    c.close()


async def _hostile(stream, manifest, tail: bytes):
    """A peer that says hello with every piece, waits for a request, then sends `tail` and vanishes."""
    n = manifest.num_pieces
    for part in message_frame(Hello(manifest.id, pack_bits([1] * n))):
        await stream.send_all(part)
    dec = FrameDecoder()
    while True:
        header, _ = await read_frame(stream, dec)
        if header["t"] == "request":
            break
    await stream.send_all(tail)
    await stream.aclose()


@pytest.mark.parametrize("kind", ["truncated", "oversized", "garbage"])
async def test_peer_that_vanishes_mid_piece_or_breaks_framing_is_dropped(tmp_path, autojump_clock, kind):
    manifest = make_policy(tmp_path / "src", 1 * MB)
    head = encode_frame({"t": "piece", "index": 0})[0][:-4]  # a piece frame's prefix up to its payload length
    tails = {
        "truncated": head + (MIN_PIECE_SIZE).to_bytes(4, "big") + b"\x01" * 1000,  # then the peer is gone
        "oversized": head + (64 * MB).to_bytes(4, "big"),
        "garbage": b"\xff" * 64,
    }
    async with trio.open_nursery() as nursery:
        c = Cluster(tmp_path, nursery, manifest, tmp_path / "src")
        node = await c.add("p0")
        reports = []
        node.on_drop = lambda *report: reports.append(report)
        c.net.add_node("evil")
        mine, theirs = c.net.connect("p0", "evil")
        node.add_link("evil", mine)
        nursery.start_soon(_hostile, theirs, manifest, tails[kind])
        while "evil" not in node.drops:
            await trio.sleep(0.1)
        assert reports == [("evil", node.drops["evil"], "evil" in node.banned)]  # reported once
        await c.add("seed", seed_from=tmp_path / "src")
        c.link("seed", "p0")  # the service survived and still completes from an honest peer
        with trio.fail_after(30):
            await node.completed.wait()
        nursery.cancel_scope.cancel()
    left = node.drops["evil"].startswith(("it left mid-piece: ", "its link broke"))
    assert left if kind == "truncated" else node.drops["evil"].startswith("it broke the piece protocol: ")
    assert ("evil" in node.banned) == (not left)  # a peer that left may come back; a protocol breach may not
    c.assert_identical("p0")
    c.close()


async def test_hello_for_another_manifest_is_refused(tmp_path, autojump_clock):
    manifest = make_policy(tmp_path / "src", 1 * MB)
    async with trio.open_nursery() as nursery:
        c = Cluster(tmp_path, nursery, manifest, tmp_path / "src")
        node = await c.add("p0")
        c.net.add_node("other")
        mine, theirs = c.net.connect("p0", "other")
        node.add_link("other", mine)
        for part in message_frame(Hello(b"\x07" * 32, pack_bits([0] * manifest.num_pieces))):
            await theirs.send_all(part)
        while "other" not in node.drops:
            await trio.sleep(0.1)
        nursery.cancel_scope.cancel()
    assert "not a hello for this manifest" in node.drops["other"]
    c.close()


async def test_broadcast_is_within_1_3x_of_kumar_ross_and_seed_uploads_at_most_1_2x(tmp_path, autojump_clock):
    """N=8 peers fetch a 32 MB policy; seed and peers share the same upload cap (U = u)."""
    size, n, rate = 32 * MB, 8, 4 * MB
    manifest = make_policy(tmp_path / "src", size)
    f = manifest.total_size
    bound = min_distribution_time(f, rate, rate, n)
    seed_cfg = TransferConfig(engine=EngineConfig(super_seed=True))
    async with trio.open_nursery() as nursery:
        c = Cluster(tmp_path, nursery, manifest, tmp_path / "src", latency=0.02, chunk=128 * 1024)
        seed = await c.add("seed", seed_from=tmp_path / "src", upload_bps=rate, config=seed_cfg)
        peers = [f"p{i}" for i in range(n)]
        for p in peers:
            await c.add(p, upload_bps=rate)
        start = trio.current_time()
        c.link_all(["seed"] + peers)
        with trio.fail_after(10 * bound):
            for p in peers:
                await c.services[p].completed.wait()
        elapsed = trio.current_time() - start
        nursery.cancel_scope.cancel()
    seed_up = sum(seed.progress().bytes_up.values())
    print(f"\nbroadcast F={f} N={n} T={elapsed:.2f}s bound={bound:.2f}s ratio={elapsed / bound:.3f} "
          f"seed_upload={seed_up / f:.3f}F")
    assert elapsed <= 1.3 * bound
    assert seed_up <= 1.2 * f
    c.assert_identical("p3")
    c.close()


def test_roles_choose_super_seeding_only_for_the_origin():
    assert TransferConfig.for_role("origin").engine.super_seed
    assert TransferConfig.for_role("seed").engine.super_seed
    assert not TransferConfig.for_role("peer").engine.super_seed
    with pytest.raises(ValueError, match="unknown transfer role"):
        TransferConfig.for_role("leech")


async def test_a_service_ticks_only_while_a_link_is_open_and_pieces_are_missing(tmp_path, autojump_clock):
    """A version kept for its window ticked every second with nothing to time out or ask: a fetching service sleeps
    until a link opens and ticks while one is open (a stalled peer is still dropped) until it holds every piece; a
    complete one (the seed from the start, the fetcher once done, its link still open) never ticks."""
    manifest = make_policy(tmp_path / "src", 1 * MB)
    async with trio.open_nursery() as nursery:
        c = Cluster(tmp_path, nursery, manifest, tmp_path / "src")
        seed = await c.add("seed", seed_from=tmp_path / "src", upload_bps=MB / 4)  # a fetch of about 4 s
        peer = await c.add("peer")
        ticks: dict[str, list[float]] = {"seed": [], "peer": []}
        for name, service in (("seed", seed), ("peer", peer)):
            tick = service.engine.tick
            service.engine.tick = lambda now, tick=tick, name=name: ticks[name].append(now) or tick(now)
        await trio.sleep(100)
        assert ticks == {"seed": [], "peer": []}  # no link yet: nothing to ask
        c.link("seed", "peer")
        with trio.fail_after(60):
            await peer.completed.wait()
        fetching_ticks = len(ticks["peer"])
        assert fetching_ticks >= 2
        await trio.sleep(100)
        assert seed.peers == ["peer"] and peer.peers == ["seed"]  # the link stays open, served complete
        assert ticks["seed"] == [] and len(ticks["peer"]) <= fetching_ticks + 1
        nursery.cancel_scope.cancel()
    c.close()
