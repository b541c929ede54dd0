"""One link's queue of things to send: control messages (have, request, cancel, reject) before pieces.

Why two lanes: a piece frame takes a whole piece-time to leave (longer when the upload is shared by several
slots), and a `have` or `request` queued behind it waited that long. In a broadcast every hop of every piece is a
have, then a request, then the piece, so that wait was paid two or three times per hop: on memnet, 64 peers each
took 2.1x the Kumar-Ross bound, most of it spent by announcements and requests standing behind pieces. A control
message now waits at most for the piece frame already on the wire; pieces keep their order.
"""

from __future__ import annotations

from collections import deque

import trio

from p2p.pieces.engine_actions import SendPiece
from p2p.pieces.wire import Message


class Outbox:
    """Control messages and piece sends for one link; `take` hands the sender all waiting control messages, or
    else the oldest piece send."""

    def __init__(self) -> None:
        self._control: deque[Message] = deque()
        self._pieces: deque[SendPiece] = deque()
        self._lot = trio.lowlevel.ParkingLot()

    def __len__(self) -> int:
        return len(self._control) + len(self._pieces)

    def put_control(self, message: Message) -> None:
        self._control.append(message)
        self._lot.unpark_all()

    def put_piece(self, send: SendPiece) -> None:
        self._pieces.append(send)
        self._lot.unpark_all()

    async def take(self) -> tuple[list[Message], SendPiece | None]:
        """(control messages, None) while any wait, else ([], the next piece send); parks while both are empty."""
        while not self._control and not self._pieces:
            await self._lot.park()
        if self._control:
            return self.take_control(), None
        return [], self._pieces.popleft()

    def take_control(self) -> list[Message]:
        """Every control message waiting now, without waiting: the sender takes those that came while it readied a
        piece along in the piece's own send (one record and one system call fewer for each such batch)."""
        batch = list(self._control)
        self._control.clear()
        return batch
