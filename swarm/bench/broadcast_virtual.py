"""A broadcast of one policy to hundreds or thousands of peers in virtual time, driven by the real piece protocol.

Every peer is a real SwarmService (p2p/pieces/transfer.py) running the real engine (p2p/pieces/engine.py) over memnet
links with upload caps and latency; only two things are simulated:

- the neighbourhood: each peer links to about `degree` others, as a real peer opens `links_per_version` links per
  version itself (swarm/config.py; others may add theirs), drawn as the union of `degree / 2` random cycles through
  every node, so the graph is connected and its diameter grows with log N (a tracker's random peer lists give the
  same shape);
- the store: all peers share one read-only copy of the policy's bytes and keep only their own have-flags. Each
  received piece is still hashed against the manifest by its receiver before the engine hears of it; holding a
  thousand copies of identical bytes on disk would only measure the disk.

Run under `trio.run(..., clock=trio.testing.MockClock(autojump_threshold=0))`: the result is the time the caps
and latency imply, whatever the machine's speed.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import trio
import trio.testing
from safetensors.numpy import save_file

from p2p.errors import StoreError
from p2p.memnet import MemoryNetwork
from p2p.pieces.engine import EngineConfig
from p2p.pieces.manifest import MIN_PIECE_SIZE, GenerationSettings, PolicyManifest, build_manifest
from p2p.pieces.transfer import SwarmService, TransferConfig
from swarm.bench.broadcast_sim import BroadcastResult
from swarm.bench.kumar_ross import min_distribution_time

MB = 1 << 20


class SharedPieces:
    """The policy's pieces, read once from its files; every simulated store serves from this one copy."""

    def __init__(self, manifest: PolicyManifest, policy_dir: Path) -> None:
        self.manifest = manifest
        self.data: list[bytes] = []
        for ref in manifest.pieces:
            with open(Path(policy_dir) / ref.file.name, "rb") as f:
                f.seek(ref.offset)
                self.data.append(f.read(ref.length))


class MemoryPieceStore:
    """The part of p2p.pieces.store.PieceStore a SwarmService uses, over SharedPieces: have-flags per peer, no disk."""

    def __init__(self, pieces: SharedPieces, complete: bool = False) -> None:
        self.pieces = pieces
        self.have = bytearray(b"\x01" * len(pieces.data) if complete else len(pieces.data))

    def add_manifest(self, manifest: PolicyManifest, signed_bytes: bytes | None = None) -> None:
        if manifest.id != self.pieces.manifest.id:
            raise StoreError("a simulated store holds exactly one manifest")

    def bitfield(self, manifest: PolicyManifest) -> bytearray:
        return bytearray(self.have)

    def is_complete(self, manifest: PolicyManifest) -> bool:
        return all(self.have)

    def read_piece(self, manifest: PolicyManifest, index: int) -> bytes:
        if not self.have[index]:
            raise StoreError(f"piece {index} is not held")
        return self.pieces.data[index]

    def write_piece(self, manifest: PolicyManifest, index: int, data: bytes, verify: bool = True) -> bool:
        """Keep the flag only: the receiving service hashed `data` against the manifest, so it equals our copy."""
        if len(data) != manifest.pieces[index].length:
            raise StoreError(f"piece {index} has the wrong length")
        self.have[index] = 1
        return False


def neighbour_graph(names: list[str], degree: int, rng: random.Random) -> set[tuple[str, str]]:
    """Links (a, b), a before b in `names`, of the union of `degree // 2` random cycles through every node: each
    node gets at most `degree` neighbours (fewer where cycles share an edge), and the whole graph is connected."""
    if len(names) <= degree + 1:
        return {(a, b) for i, a in enumerate(names) for b in names[i + 1:]}
    order = {name: i for i, name in enumerate(names)}
    edges: set[tuple[str, str]] = set()
    for _ in range(max(1, degree // 2)):
        cycle = names[:]
        rng.shuffle(cycle)
        for a, b in zip(cycle, cycle[1:] + cycle[:1]):
            edges.add((a, b) if order[a] < order[b] else (b, a))
    return edges


def make_virtual_policy(path: Path, total_bytes: int, piece_size: int = MIN_PIECE_SIZE) -> PolicyManifest:
    """A policy of `total_bytes` of random float32 weights in one safetensors file, and its manifest."""
    path.mkdir(parents=True, exist_ok=True)
    weights = np.random.default_rng(0).standard_normal(max(1, total_bytes // 4), dtype=np.float32)
    save_file({"weight": weights}, str(path / "model.safetensors"))
    (path / "model.json").write_text('{"architecture": "bench", "tokenizer": "none"}')
    return build_manifest(path, run="virtual", version=1, parent_version=None, created_at=0.0,
                          generation=GenerationSettings(8, 0.6, 256, 0), piece_size=piece_size)


@dataclass(frozen=True)
class VirtualSwarm:
    """The shape of one simulated broadcast: how many peers, their caps and links."""

    peers: int = 256
    degree: int = 8  # data links per peer (a real peer opens links_per_version per version itself)
    seed_upload_bps: float = 4 * MB
    peer_upload_bps: float = 4 * MB
    latency: float = 0.02  # seconds per link, each way
    chunk: int = 128 * 1024  # memnet's unit of transmission
    rng_seed: int = 0


async def simulate_virtual_broadcast(manifest: PolicyManifest, policy_dir: Path, shape: VirtualSwarm, *,
                                     engine: EngineConfig | None = None) -> BroadcastResult:
    """Broadcast `manifest` from one super-seed to `shape.peers` peers; returns the time against the bound."""
    pieces = SharedPieces(manifest, policy_dir)
    net = MemoryNetwork(latency=shape.latency, chunk=shape.chunk)
    base = engine or EngineConfig()
    names = ["seed"] + [f"peer{i}" for i in range(shape.peers)]
    services: dict[str, SwarmService] = {}
    for name in names:
        is_seed = name == "seed"
        net.add_node(name, upload_bps=shape.seed_upload_bps if is_seed else shape.peer_upload_bps)
        config = EngineConfig(**{**base.__dict__, "super_seed": True}) if is_seed else base
        rng = random.Random(f"{shape.rng_seed}{name}")  # per node: peers that do not all pick alike
        services[name] = SwarmService(manifest, MemoryPieceStore(pieces, complete=is_seed),
                                      config=TransferConfig(engine=config), rng=rng)
    done: dict[str, float] = {}
    async with trio.open_nursery() as nursery:
        for service in services.values():
            await nursery.start(service.run)
        start = trio.current_time()
        for a, b in sorted(neighbour_graph(names, shape.degree, random.Random(shape.rng_seed))):
            sa, sb = net.connect(a, b)
            services[a].add_link(b, sa)
            services[b].add_link(a, sb)
        for name in names[1:]:
            await services[name].completed.wait()
            done[name] = trio.current_time() - start
        nursery.cancel_scope.cancel()
    bound = min_distribution_time(manifest.total_size, shape.seed_upload_bps, shape.peer_upload_bps, shape.peers)
    seed_up = sum(services["seed"].progress().bytes_up.values())
    return BroadcastResult(manifest.total_size, shape.peers, max(done.values()), bound, seed_up, done)


def run_virtual(size_bytes: int, shape: VirtualSwarm, work_dir: Path,
                piece_size: int = MIN_PIECE_SIZE) -> BroadcastResult:
    """One virtual broadcast of a fresh random policy of `size_bytes` (files under `work_dir`)."""
    manifest = make_virtual_policy(Path(work_dir) / "policy", size_bytes, piece_size)
    return trio.run(simulate_virtual_broadcast, manifest, Path(work_dir) / "policy", shape,
                    clock=trio.testing.MockClock(autojump_threshold=0))


__all__ = ["MemoryPieceStore", "SharedPieces", "VirtualSwarm", "make_virtual_policy", "neighbour_graph",
           "run_virtual", "simulate_virtual_broadcast"]
