"""Super-seeding, the part of the swarm engine an origin uses when its upload is the bottleneck of a flash crowd:
it advertises nothing and reveals pieces one by one, always one sent the fewest times so far, so no piece goes out
twice while another has never gone out (docs/reference.md#torrent-mechanics). Sans-IO like the engine it belongs to.
"""

from __future__ import annotations

import numpy as np

from p2p.pieces.engine_actions import Action, Send
from p2p.pieces.engine_config import EngineConfig
from p2p.pieces.peer_state import PeerState
from p2p.pieces.wire import Have


class SuperSeeding:
    """The reveal decisions of p2p.pieces.engine.SwarmEngine, which holds the state they read."""

    config: EngineConfig
    num_pieces: int
    peers: dict[str, PeerState]
    super_seeding: bool
    sent_count: np.ndarray
    availability: np.ndarray
    rank: np.ndarray

    def _reveal(self, peer: str, now: float) -> list[Action]:
        """Super-seed: keep `super_seed_reveal` unsent pieces announced to `peer`, least-sent first."""
        if not self.super_seeding or peer not in self.peers:
            return []
        state = self.peers[peer]
        state.revealed = {i for i in state.revealed if not state.bits[i]}
        out: list[Action] = []
        # after the first full copy, one piece at a time: the peers hold every piece by then and should trade
        limit = self.config.super_seed_reveal if not self.sent_count.all() else 1
        while len(state.revealed) < limit:
            index = self._least_sent(state, now)
            if index is None:
                break
            state.revealed.add(index)
            out.append(Send(peer, Have(index)))
        return out

    def reveal_lapsed(self, now: float) -> list[Action]:
        """Super-seed: reveal the pieces whose promises lapsed (their peers never asked within `reveal_grace`); the
        adapter calls this now and then, since a complete seed gets no other event while its peers wait."""
        return self._reveal_all(now) if self.super_seeding else []

    def _reveal_all(self, now: float) -> list[Action]:
        out: list[Action] = []
        for name in list(self.peers):
            out += self._reveal(name, now)
        return out

    def _least_sent(self, state: PeerState, now: float) -> int | None:
        """Never-sent, unpromised pieces first; while any never-sent piece is promised elsewhere, reveal nothing
        rather than a second copy; after the first full copy, the least-sent and then rarest piece.

        A promise holds its piece back from others while its peer may still ask for it: once it has asked for a
        piece on its link, or for `reveal_grace` after its link opened. A link that only takes a place and never
        asks (a crowd of them, each promised pieces) held back every piece of a small version, and the peers that
        did ask got nothing until those links were released; a grace of none sent peers that linked together the
        same pieces, before any of them had asked."""
        promised = np.zeros(self.num_pieces, dtype=np.int64)
        holding = np.zeros(self.num_pieces, dtype=np.int64)
        for other in self.peers.values():
            if other.revealed:
                promised[list(other.revealed)] += 1
                if other.asked or now - other.linked_at < self.config.reveal_grace:
                    holding[list(other.revealed)] += 1
        candidates = ~state.bits
        if state.revealed:
            candidates[list(state.revealed)] = False
        if not self.sent_count.all():  # first round: only pieces nobody has been sent or promised
            candidates &= (self.sent_count == 0) & (holding == 0)
        idx = np.flatnonzero(candidates)
        if idx.size == 0:
            return None
        n = self.num_pieces
        key = ((self.sent_count[idx] + promised[idx]) * (n + 1) + self.availability[idx]) * n + self.rank[idx]
        return int(idx[np.argmin(key)])
