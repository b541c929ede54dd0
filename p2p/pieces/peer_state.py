"""What the swarm engine knows about one connected peer, in a module of its own so that the engine
(p2p/pieces/engine.py) and the pickers it consults (p2p/pieces/picker.py) both build on it without importing each
other."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

import numpy as np


@dataclass
class PeerState:
    """What the engine knows about one connected peer."""

    bits: np.ndarray  # bool per piece: the peer holds it (as far as it told us)
    timed_out: np.ndarray  # bool per piece: a request for it timed out; ask this peer again only as the sole holder
    held: int = 0
    requested: dict[int, float] = field(default_factory=dict)  # our requests to it -> when sent
    cancelled: set[int] = field(default_factory=set)  # requests we cancelled (a piece may still arrive)
    queue: deque[int] = field(default_factory=deque)  # its requests to us
    open_requests: int = 0  # its requests not yet served or cancelled, duplicates and refused ones included
    sending: set[int] = field(default_factory=set)  # our SendPiece actions in progress to it
    delivered: set[int] = field(default_factory=set)  # pieces sent to it on this link: asking again is a breach
    forgiven: set[int] = field(default_factory=set)  # delivered pieces it cancelled once (one re-request allowed)
    revealed: set[int] = field(default_factory=set)  # super-seed: pieces announced to it and not yet sent
    asked: bool = False  # it asked for a piece on this link (a super-seed's promise to it holds the piece back)
    linked_at: float = 0.0  # when it connected
    last_piece_at: float = 0.0  # last piece received, or when it last started owing us pieces
    refused_since: float = float("-inf")  # start of the backoff window its BUSY refusals are counted in
    refusals: int = 0  # its requests refused as BUSY since refused_since
