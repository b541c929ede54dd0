"""The engine fetches only the pieces it wants (one of a version's two forms), announces pieces stored without the
protocol, and fetches more when asked."""

from __future__ import annotations

from p2p.pieces.engine import Completed, EngineConfig, Send, StorePiece, SwarmEngine
from p2p.pieces.wire import Have, Request

ALL = b"\x01" * 6


def requested(actions) -> set[int]:
    return {a.message.index for a in actions if isinstance(a, Send) and isinstance(a.message, Request)}


def test_only_wanted_pieces_are_asked_for_and_their_arrival_completes_the_version():
    eng = SwarmEngine(6, bytes(6), config=EngineConfig(pipeline_depth=8, endgame=False),
                      wanted=b"\x01\x01\x00\x00\x00\x01")
    asked = requested(eng.peer_connected("seed", ALL, 0.0))
    assert asked == {0, 1, 5}
    out = []
    for index in sorted(asked):
        out += eng.piece_received("seed", index, True, 1.0)
    assert any(isinstance(a, Completed) for a in out) and eng.complete
    assert requested(out) == set()  # the unwanted pieces are never asked for


def test_pieces_stored_without_the_protocol_are_announced_not_stored_again():
    eng = SwarmEngine(6, b"\x01\x01\x00\x00\x00\x01", wanted=b"\x01\x01\x00\x00\x00\x01")
    eng.peer_connected("peer", bytes(6), 0.0)
    out = eng.pieces_added([2, 3, 4], 1.0)
    assert not any(isinstance(a, StorePiece) for a in out)
    assert {a.message.index for a in out if isinstance(a, Send) and isinstance(a.message, Have)} == {2, 3, 4}
    assert eng.have.all() and eng.held == 6


def test_wanting_more_after_completion_fetches_it_and_completes_again():
    eng = SwarmEngine(6, b"\x01\x01\x00\x00\x00\x00", config=EngineConfig(pipeline_depth=8, endgame=False),
                      wanted=b"\x01\x01\x00\x00\x00\x00")
    eng.peer_connected("seed", ALL, 0.0)
    assert eng.complete
    asked = requested(eng.want(b"\x00\x00\x01\x01\x01\x01", 1.0))
    assert asked == {2, 3, 4, 5} and not eng.complete and eng.wanted_count == 6
    out = [a for index in sorted(asked) for a in eng.piece_received("seed", index, True, 2.0)]
    assert sum(isinstance(a, Completed) for a in out) == 1 and eng.complete
