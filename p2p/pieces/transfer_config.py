"""How one node runs the piece protocol for one manifest (p2p/pieces/transfer.py runs it)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from p2p.pieces.engine_config import EngineConfig
from p2p.pieces.wire import RECEIVE_CHUNK


@dataclass(frozen=True)
class TransferConfig:
    """How one node runs the piece protocol for one manifest.

    The node's own upload cap is no field here: it spans every manifest the node serves, so it is one TokenBucket
    the node hands to each of its services (`SwarmService(upload_bucket=...)`).
    """

    engine: EngineConfig = field(default_factory=EngineConfig)
    peer_upload_bps: float = math.inf  # cap on this manifest's upload to any one peer (bytes/s), per link
    handshake_timeout: float = 10.0  # the peer's hello must arrive within this
    send_timeout: float = 60.0  # one frame (a whole piece) must be sent within this
    tick_interval: float = 1.0  # how often request timeouts and stalls are checked
    receive_chunk: int = RECEIVE_CHUNK  # bytes asked of the stream per read: a whole data-channel record, never a slice

    @classmethod
    def for_role(cls, role: str, **overrides) -> TransferConfig:
        """Transfer settings per role.

        `origin` (the publishing trainer) and `seed` (a node that starts with the whole policy and may face a flash
        crowd) super-seed: measured on memnet with N=8 and U=u, a plain full seed uploads 1.9x the file and the swarm
        takes 1.9x the Kumar-Ross bound (peers ask it for the same pieces); a super-seed uploads 1.05x in 1.08x.
        `peer`: a node that downloads and re-seeds.
        """
        if role not in ("origin", "seed", "peer"):
            raise ValueError(f"unknown transfer role {role!r} (use 'origin', 'seed' or 'peer')")
        engine = overrides.pop("engine", EngineConfig())
        if role in ("origin", "seed"):
            engine = EngineConfig(**{**engine.__dict__, "super_seed": True})
        return cls(engine=engine, **overrides)

    def __post_init__(self) -> None:
        if min(self.handshake_timeout, self.send_timeout, self.tick_interval,
               self.peer_upload_bps) <= 0 or self.receive_chunk < 1:
            raise ValueError("transfer timeouts, rates and chunk sizes must be positive")
