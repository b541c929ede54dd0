"""A link's outbox: control messages that arrive while a piece is readied are taken along in the piece's send."""

from __future__ import annotations

from p2p.pieces.engine import SendPiece
from p2p.pieces.outbox import Outbox
from p2p.pieces.wire import Have, Request


async def test_control_that_arrives_after_a_piece_was_taken_leaves_with_it():
    box = Outbox()
    box.put_piece(SendPiece("p", 4))
    assert await box.take() == ([], SendPiece("p", 4))
    box.put_control(Have(1))
    box.put_control(Request(2))
    assert box.take_control() == [Have(1), Request(2)]  # the sender puts them in the piece's own send
    assert box.take_control() == [] and len(box) == 0
