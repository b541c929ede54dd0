"""A bounded replay filter for signed envelopes: pure state, no clock of its own (`now` is passed in).

Why (sender, seq) and a time window: an envelope older than the freshness window is refused by its timestamp
anyway, so the filter only needs to remember what it accepted inside that window. Memory is capped by
`capacity`; when a flood fills it, the entries with the oldest timestamps are forgotten and everything at or
below the newest forgotten timestamp is refused from then on (`floor`). That errs on the side of dropping a late
but honest message rather than ever accepting a replay, and keeps memory flat whatever the traffic.
"""

from __future__ import annotations

import heapq


class ReplayFilter:
    """Remembers the (sender, seq) pairs accepted within the last `window_s` seconds, at most `capacity` of them."""

    def __init__(self, window_s: float, capacity: int = 100_000) -> None:
        if window_s <= 0 or capacity <= 0:
            raise ValueError("a replay filter needs a positive window and capacity")
        self.window_s = window_s
        self.capacity = capacity
        self.floor = float("-inf")
        self._seen: set[tuple[bytes, int]] = set()
        self._by_ts: list[tuple[float, bytes, int]] = []

    def __len__(self) -> int:
        return len(self._seen)

    def is_fresh(self, sender: bytes, seq: int, ts: float, now: float) -> bool:
        """True if (sender, seq) was not accepted before and `ts` is above the eviction floor (no side effect)."""
        self._expire(now)
        return ts > self.floor and (sender, seq) not in self._seen

    def accept(self, sender: bytes, seq: int, ts: float, now: float) -> bool:
        """Record (sender, seq) if fresh; return False for a replay. Call only after the signature checked out,
        so a forger cannot burn someone else's sequence numbers."""
        if not self.is_fresh(sender, seq, ts, now):
            return False
        self._seen.add((sender, seq))
        heapq.heappush(self._by_ts, (ts, sender, seq))
        while len(self._seen) > self.capacity:
            old_ts, old_sender, old_seq = heapq.heappop(self._by_ts)
            self._seen.discard((old_sender, old_seq))
            self.floor = max(self.floor, old_ts)
        return True

    def _expire(self, now: float) -> None:
        """Forget entries whose timestamp left the window: the timestamp check refuses them from now on."""
        horizon = now - self.window_s
        while self._by_ts and self._by_ts[0][0] < horizon:
            _, sender, seq = heapq.heappop(self._by_ts)
            self._seen.discard((sender, seq))
