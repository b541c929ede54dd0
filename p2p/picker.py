"""Piece pickers: which piece to ask a given peer for next.

A picker only chooses; the engine owns the state and enforces the invariants (never a piece we hold, never from a
peer without it, never past the pipeline depth). Keeping the naive picker beside the real one gives the tests an
oracle: both must complete the same swarms under the same invariants.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from p2p.engine import PeerState, SwarmEngine


class Picker(Protocol):
    def pick(self, engine: SwarmEngine, peer: PeerState) -> int | None:
        """A piece we lack, nobody has been asked for, and `peer` holds; None when there is none."""


class NaivePicker:
    """Lowest index first: the reference oracle (correct, but piles every peer onto the same pieces)."""

    def pick(self, engine: SwarmEngine, peer: PeerState) -> int | None:
        candidates = [i for i in engine.missing if peer.bits[i] and i not in engine.pending and i not in peer.timed_out]
        return min(candidates, default=None)


class RarestFirstPicker:
    """A few random pieces first (something to trade at once), then rarest-first with random tie-breaks.

    Rarest-first keeps every piece replicated as widely as possible, so when any peer (or the seed) leaves, the
    swarm still holds a full copy, and a newcomer always finds pieces that others lack. Cost: O(missing) per pick,
    which is about a thousand entries for a 1 GB policy at 1 MiB pieces.
    """

    def __init__(self, random_first: int = 4) -> None:
        self.random_first = random_first

    def pick(self, engine: SwarmEngine, peer: PeerState) -> int | None:
        bits, pending, avail, rank, skip = peer.bits, engine.pending, engine.availability, engine.rank, peer.timed_out
        use_rarity = engine.held >= self.random_first
        best, best_key = None, None
        for i in engine.missing:
            if not bits[i] or i in pending or i in skip:
                continue
            key = (avail[i], rank[i]) if use_rarity else (0, rank[i])
            if best_key is None or key < best_key:
                best, best_key = i, key
        return best
