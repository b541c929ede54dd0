"""The swarm engine's tunables (p2p/pieces/engine.py says what each policy does)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class EngineConfig:
    """Tunables of the swarm engine."""

    pipeline_depth: int = 8  # requests in flight per peer
    upload_slots: int = 2  # pieces uploaded at once, over all peers: fewer slots hand each piece on sooner
    upload_backlog: int = 2  # requests queued behind the busy slots; past it a request is refused as BUSY
    busy_backoff: float = 0.2  # seconds a requester asks nothing of a peer that refused it as BUSY
    max_queued_requests: int = 256  # requests of one peer not yet served, duplicates included; past it: a flood
    random_first: int = 4  # pieces picked at random before rarest-first
    endgame: bool = True  # duplicate the last requests across holders
    endgame_copies: int = 2  # at most this many peers asked for one piece in endgame
    request_timeout: float = 30.0  # seconds before a request is re-issued elsewhere
    stall_timeout: float = 120.0  # seconds a peer may owe pieces without sending any before it is dropped
    super_seed: bool = False  # act as a super-seed while we hold everything
    super_seed_reveal: int = 4  # pieces revealed and not yet sent, per peer, in super-seed mode
    reveal_grace: float = 0.5  # seconds a super-seed's promise to a peer that has not asked yet holds its piece back
    upload_factor: float = 3.0  # pieces one peer may take from us, in copies of the version (upload_ledger.py)
    earn_per_piece: float = 1.0  # more pieces a peer may take for each verified piece it served us

    def __post_init__(self) -> None:
        if min(self.pipeline_depth, self.upload_slots, self.max_queued_requests, self.super_seed_reveal) < 1:
            raise ValueError("engine depths, slots and queue sizes must be at least 1")
        if self.request_timeout <= 0 or self.stall_timeout <= 0 or self.busy_backoff <= 0:
            raise ValueError("engine timeouts and the busy backoff must be positive")
        if self.upload_backlog < 0:
            raise ValueError("upload_backlog must not be negative")
        if self.upload_factor < 1 or self.earn_per_piece < 0:
            raise ValueError("upload_factor must be at least 1 (one copy) and earn_per_piece not negative")
