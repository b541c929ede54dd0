"""One link's queue of things to send: control messages (have, request, cancel, reject) before pieces.

Why two lanes: a piece frame takes a whole piece-time to leave (longer when the upload is shared by several
slots), and a `have` or `request` queued behind it waited that long. In a broadcast every hop of every piece is a
have, then a request, then the piece, so that wait was paid two or three times per hop: on memnet, 64 peers each
took 2.1x the Kumar-Ross bound, most of it spent by announcements and requests standing behind pieces. A control
message now waits at most for the piece frame already on the wire; pieces keep their order.

Why some control messages may wait a little (`put_lazy`, for `have`): every verified piece is announced to every
neighbour, so each piece a peer receives costs each link a record of its own both ways, about 70 us of the
scheduler and the channel per side. Uncapped on loopback those announcements, not the piece bytes, made the
swarm cost more CPU than one origin serving everyone. A `have` that waits up to `lazy_delay` for the next ones
(or for any other message, which takes it along) shares their record; a piece-time of a capped link is far longer.
"""

from __future__ import annotations

from collections import deque
from typing import Any

import trio


class Outbox:
    """Control messages and piece sends for one link; `take` hands the sender all waiting control messages, or
    else the oldest piece send."""

    def __init__(self, lazy_delay: float = 0.0) -> None:
        self._control: deque[Any] = deque()
        self._pieces: deque[Any] = deque()
        self._lot = trio.lowlevel.ParkingLot()
        self.lazy_delay = lazy_delay
        self._urgent = False  # a control message that must not wait is queued
        self._lazy_since: float | None = None  # when the oldest waiting lazy message was queued

    def __len__(self) -> int:
        return len(self._control) + len(self._pieces)

    def put_control(self, message: Any) -> None:
        self._control.append(message)
        self._urgent = True
        self._lot.unpark_all()

    def put_lazy(self, message: Any) -> None:
        """A control message that may wait up to `lazy_delay` to leave with others (kept in order with them)."""
        self._control.append(message)
        if self._lazy_since is None:
            self._lazy_since = trio.current_time()
            self._lot.unpark_all()  # a parked sender learns the deadline; later ones need not wake it

    def put_piece(self, send: Any) -> None:
        self._pieces.append(send)
        self._lot.unpark_all()

    async def take(self) -> tuple[list[Any], Any | None]:
        """(control messages, None) while any must leave, else ([], the next piece send); parks while neither."""
        while True:
            if self._urgent or (self._lazy_since is not None and trio.current_time() >= self._lazy_due()):
                return self.take_control(), None
            if self._pieces:  # lazy messages leave with it (the sender's `take_control`)
                return [], self._pieces.popleft()
            if self._lazy_since is None:
                await self._lot.park()
            else:
                with trio.move_on_at(self._lazy_due()):
                    await self._lot.park()

    def _lazy_due(self) -> float:
        return self._lazy_since + self.lazy_delay

    def take_control(self) -> list[Any]:
        """Every control message waiting now, without waiting: the sender takes those that came while it readied a
        piece along in the piece's own send (one record and one system call fewer for each such batch)."""
        batch = list(self._control)
        self._control.clear()
        self._urgent, self._lazy_since = False, None
        return batch
