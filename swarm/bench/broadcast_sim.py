"""A simulated broadcast of one policy from a seed to N peers over the in-memory network, in trio time.

It runs the real piece protocol (p2p.pieces.transfer and p2p.pieces.engine) over p2p.memnet's capped streams, so the
time it reports is the engine's own, and compares it with the Kumar-Ross lower bound for the same caps.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from pathlib import Path

import trio

from p2p.memnet import MemoryNetwork
from p2p.pieces.engine import EngineConfig
from p2p.pieces.manifest import PolicyManifest
from p2p.pieces.store import PieceStore
from p2p.pieces.transfer import SwarmService, TransferConfig
from swarm.bench.kumar_ross import min_distribution_time


@dataclass(frozen=True)
class BroadcastResult:
    """One simulated broadcast of a policy from one seed to N peers, against the Kumar-Ross bound."""

    file_bytes: int
    peers: int
    seconds: float  # until the last peer held every verified piece
    bound_seconds: float  # Kumar-Ross T_min for the same caps
    seed_upload_bytes: int
    completion_seconds: dict[str, float]  # per peer

    @property
    def ratio(self) -> float:
        return self.seconds / self.bound_seconds

    @property
    def seed_upload_ratio(self) -> float:
        return self.seed_upload_bytes / self.file_bytes

    def to_json(self) -> dict:
        return {"file_bytes": self.file_bytes, "peers": self.peers, "seconds": self.seconds,
                "bound_seconds": self.bound_seconds, "ratio": self.ratio, "seed_upload_ratio": self.seed_upload_ratio,
                "completion_seconds": self.completion_seconds}


async def simulate_broadcast(manifest: PolicyManifest, policy_dir: Path | str, work_dir: Path | str, *,
                             peers: int = 8, seed_upload_bps: float,
                             peer_upload_bps: float, peer_download_bps: float = math.inf, latency: float = 0.02,
                             chunk: int = 128 * 1024, super_seed: bool = True,
                             engine: EngineConfig | None = None) -> BroadcastResult:
    """Broadcast `manifest` (files in `policy_dir`) from a seed to `peers` fresh stores under `work_dir`.

    Run it under `trio.run(..., clock=trio.testing.MockClock(autojump_threshold=0))` for virtual time: the result
    is then the transfer time the caps imply, whatever the machine's speed. Every peer's pieces are verified.
    """


    work_dir = Path(work_dir)
    net = MemoryNetwork(latency=latency, chunk=chunk)
    base = engine or EngineConfig()
    seed_engine = EngineConfig(**{**base.__dict__, "super_seed": super_seed})
    stores = {"seed": PieceStore(work_dir / "seed")}
    stores["seed"].add_local_policy(manifest, policy_dir)
    names = [f"peer{i}" for i in range(peers)]
    for name in names:
        stores[name] = PieceStore(work_dir / name)
    net.add_node("seed", upload_bps=seed_upload_bps)
    services = {"seed": SwarmService(manifest, stores["seed"], config=TransferConfig(engine=seed_engine),
                                     rng=random.Random("seed"))}
    for name in names:  # seeded per node: reproducible runs, and peers that do not all pick alike
        net.add_node(name, upload_bps=peer_upload_bps, download_bps=peer_download_bps)
        services[name] = SwarmService(manifest, stores[name], config=TransferConfig(engine=base),
                                      rng=random.Random(name))
    done: dict[str, float] = {}
    try:
        async with trio.open_nursery() as nursery:
            for service in services.values():
                await nursery.start(service.run)
            start = trio.current_time()
            everyone = ["seed"] + names
            for i, a in enumerate(everyone):
                for b in everyone[i + 1 :]:
                    sa, sb = net.connect(a, b)
                    services[a].add_link(b, sa)
                    services[b].add_link(a, sb)
            for name in names:
                await services[name].completed.wait()
                done[name] = trio.current_time() - start
            nursery.cancel_scope.cancel()
    finally:
        for store in stores.values():
            store.close()
    bound = min_distribution_time(manifest.total_size, seed_upload_bps, peer_upload_bps, peers, peer_download_bps)
    seed_up = sum(services["seed"].progress().bytes_up.values())
    return BroadcastResult(manifest.total_size, peers, max(done.values()), bound, seed_up, done)
