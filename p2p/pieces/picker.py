"""Piece pickers: which piece to ask a given peer for next.

A picker only chooses; the engine owns the state and enforces the invariants (never a piece we hold, never from a
peer without it, never past the pipeline depth). Keeping the naive picker beside the real one gives the tests an
oracle: both must complete the same swarms under the same invariants.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

import numpy as np

from p2p.pieces.peer_state import PeerState


class SwarmView(Protocol):
    """What a picker reads of the engine (p2p.pieces.engine.SwarmEngine): per-piece flags and counts, and the peers."""

    @property
    def num_pieces(self) -> int: ...
    @property
    def held(self) -> int: ...  # pieces we hold
    @property
    def have(self) -> np.ndarray: ...  # bool per piece: we hold it
    @property
    def wanted(self) -> np.ndarray: ...  # bool per piece: one to fetch (a version's full files, or its patch)
    @property
    def pending_mask(self) -> np.ndarray: ...  # bool per piece: already requested of some peer
    @property
    def availability(self) -> np.ndarray: ...  # connected peers holding each piece
    @property
    def rank(self) -> np.ndarray: ...  # random tie-break between equally rare pieces
    @property
    def peers(self) -> Mapping[str, PeerState]: ...


class Picker(Protocol):
    def pick(self, engine: SwarmView, peer: PeerState, count: int) -> list[int]:
        """Up to `count` pieces, best first, that we lack, nobody has been asked for, and `peer` holds."""


def _candidates(engine: SwarmView, peer: PeerState) -> np.ndarray:
    """A piece whose request to this peer timed out is asked of it again only when no other holder is left that
    has not timed out on it too: a super-seed is the only holder of the pieces it reveals, and when every holder's
    request had timed out (a loaded machine) each was avoided for the other's sake and the piece never came."""
    idx = np.flatnonzero(peer.bits & engine.wanted & ~engine.have & ~engine.pending_mask)
    timed = idx[peer.timed_out[idx]]
    if timed.size:
        fresh_elsewhere = np.zeros(timed.size, dtype=bool)
        for other in engine.peers.values():
            if other is not peer:
                fresh_elsewhere |= other.bits[timed] & ~other.timed_out[timed]
        idx = np.setdiff1d(idx, timed[fresh_elsewhere], assume_unique=True)
    return idx


class NaivePicker:
    """Lowest index first: the reference oracle (correct, but piles every peer onto the same pieces)."""

    def pick(self, engine: SwarmView, peer: PeerState, count: int) -> list[int]:
        return _candidates(engine, peer)[:count].tolist()


class RarestFirstPicker:
    """A few random pieces first (something to trade at once), then rarest-first with random tie-breaks.

    Rarest-first keeps every piece replicated as widely as possible, so when any peer (or the seed) leaves, the
    swarm still holds a full copy, and a newcomer always finds pieces that others lack. One pick is a handful of
    vector operations over all pieces plus a partial sort of the `count` best.
    """

    def __init__(self, random_first: int = 4) -> None:
        self.random_first = random_first

    def pick(self, engine: SwarmView, peer: PeerState, count: int) -> list[int]:
        idx = _candidates(engine, peer)
        if idx.size == 0 or count < 1:
            return []
        key = engine.rank[idx]
        if engine.held >= self.random_first:
            key = engine.availability[idx] * engine.num_pieces + key
        if idx.size > count:
            best = np.argpartition(key, count - 1)[:count]
            return idx[best[np.argsort(key[best])]].tolist()
        return idx[np.argsort(key)].tolist()
