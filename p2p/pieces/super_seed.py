"""What a super-seed reveals to a peer, and which piece next (p2p/pieces/engine.py says when it reveals).

An origin whose upload is the bottleneck advertises nothing and reveals pieces one by one, least-sent first. The
choice is a picker of the seed's side, reading the engine's per-piece counts; the reveals only mark what they
announce in each peer's state.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np

from p2p.pieces.engine_actions import Action, Send
from p2p.pieces.engine_config import EngineConfig
from p2p.pieces.peer_state import PeerState
from p2p.pieces.picker import SwarmView
from p2p.pieces.wire import Have


class SeedView(SwarmView, Protocol):
    """What the reveals read of the engine (p2p.pieces.engine.SwarmEngine) beyond a picker's view."""

    @property
    def sent_count(self) -> np.ndarray: ...  # uploads started per piece
    @property
    def super_seeding(self) -> bool: ...  # an origin that reveals pieces one by one instead of advertising them
    @property
    def config(self) -> EngineConfig: ...


def least_sent(engine: SeedView, state: PeerState, now: float, reveal_grace: float) -> int | None:
    """Never-sent, unpromised pieces first; while any never-sent piece is promised elsewhere, reveal nothing
    rather than a second copy; after the first full copy, the least-sent and then rarest piece.

    A promise holds its piece back from others while its peer may still ask for it: once it has asked for a
    piece on its link, or for `reveal_grace` after its link opened. A link that only takes a place and never
    asks (a crowd of them, each promised pieces) held back every piece of a small version, and the peers that
    did ask got nothing until those links were released; a grace of none sent peers that linked together the
    same pieces, before any of them had asked."""
    promised = np.zeros(engine.num_pieces, dtype=np.int64)
    holding = np.zeros(engine.num_pieces, dtype=np.int64)
    for other in engine.peers.values():
        if other.revealed:
            promised[list(other.revealed)] += 1
            if other.asked or now - other.linked_at < reveal_grace:
                holding[list(other.revealed)] += 1
    candidates = ~state.bits
    if state.revealed:
        candidates[list(state.revealed)] = False
    sent = engine.sent_count
    if not sent.all():  # first round: only pieces nobody has been sent or promised
        candidates &= (sent == 0) & (holding == 0)
    idx = np.flatnonzero(candidates)
    if idx.size == 0:
        return None
    n = engine.num_pieces
    key = ((sent[idx] + promised[idx]) * (n + 1) + engine.availability[idx]) * n + engine.rank[idx]
    return int(idx[np.argmin(key)])


def reveal(engine: SeedView, peer: str, now: float) -> list[Action]:
    """Super-seed: keep `super_seed_reveal` unsent pieces announced to `peer`, least-sent first (nothing when the
    engine is not super-seeding). Marks what it reveals in the peer's state, which the engine then sends."""
    if not engine.super_seeding or peer not in engine.peers:
        return []
    state = engine.peers[peer]
    state.revealed = {i for i in state.revealed if not state.bits[i]}
    out: list[Action] = []
    # after the first full copy, one piece at a time: the peers hold every piece by then and should trade
    limit = engine.config.super_seed_reveal if not engine.sent_count.all() else 1
    while len(state.revealed) < limit:
        index = least_sent(engine, state, now, engine.config.reveal_grace)
        if index is None:
            break
        state.revealed.add(index)
        out.append(Send(peer, Have(index)))
    return out


def reveal_all(engine: SeedView, now: float) -> list[Action]:
    """`reveal` to every linked peer."""
    out: list[Action] = []
    for name in list(engine.peers):
        out += reveal(engine, name, now)
    return out
