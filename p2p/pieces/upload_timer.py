"""How long this node's uploads take, and so whether a request queued now would start sending soon.

Why: a loaded uploader refuses requests as BUSY (p2p/pieces/engine.py) so that requesters ask the piece's other
holders instead of waiting behind its queue, and a refused requester leaves it alone for a backoff. That trade
pays only where the queue is slow: on a 32 Mbit/s link a 256 KiB piece takes about 65 ms, and a few queued pieces
are a wait longer than the backoff; on an uncapped loopback link a piece leaves in a few milliseconds, and every
refusal cost its requester the whole backoff while the queue would have drained many times over.

No IO and no clock: the engine passes `now` in with each event.
"""

from __future__ import annotations

SMOOTHING = 8
"""Uploads the moving average spans, about: recent enough to follow a cap that changes, steady enough that one
slow piece (a page fault, a busy moment) does not flip the decision."""


class UploadTimer:
    """Start and end times of the uploads in progress, and a moving average of one upload's duration."""

    def __init__(self) -> None:
        self._started: dict[tuple[str, int], float] = {}  # upload in progress (peer, piece) -> when it was issued
        self.seconds: float | None = None  # average duration of a delivered upload; None before the first

    def started(self, peer: str, index: int, now: float) -> None:
        self._started[(peer, index)] = now

    def ended(self, peer: str, index: int, now: float, delivered: bool) -> None:
        """An upload ended; one that was delivered counts towards the average (an abandoned one says nothing)."""
        began = self._started.pop((peer, index), None)
        if began is None or not delivered:
            return
        last = self.seconds
        self.seconds = now - began if last is None else last + (now - began - last) / SMOOTHING

    def forget(self, peer: str, indices: set[int]) -> None:
        """The peer left with these uploads in progress."""
        for index in indices:
            self._started.pop((peer, index), None)

    def drains_within(self, ahead: int, slots: int, seconds: float) -> bool:
        """Whether a request behind `ahead` uploads (in progress and queued), sent `slots` at a time, would start
        within `seconds`; False while no upload has been timed, so a new uploader decides by its counts alone."""
        return self.seconds is not None and ahead * self.seconds / slots <= seconds
