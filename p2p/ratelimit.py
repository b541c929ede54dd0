"""Token buckets on trio time, for per-peer and per-node upload caps (and memnet's link model).

Scheduling by reservation (the "virtual scheduling" form of a token bucket): a sender reserves its bytes at once
and is told how long to wait, so reservations are served in order, several links sharing one node cap interleave
chunk by chunk, and a sender limited by two buckets (its peer's cap and its node's cap) waits for the slower one
rather than for both in turn. Time only comes from `trio.current_time()` and waiting only from `trio.sleep`, so
under the autojump clock a capped transfer takes exactly its virtual duration.
"""

from __future__ import annotations

import math

import trio


class TokenBucket:
    """`rate` bytes per second with bursts of up to `burst` bytes; rate=math.inf means no cap."""

    def __init__(self, rate: float, burst: float | None = None) -> None:
        if rate <= 0:
            raise ValueError("a rate limit must be positive (use math.inf for none)")
        self.rate = rate
        self.burst = burst if burst is not None else (64 * 1024 if math.isfinite(rate) else math.inf)
        self._tokens = 0.0
        self._stamp: float | None = None

    @property
    def unlimited(self) -> bool:
        return not math.isfinite(self.rate)

    def reserve(self, amount: int, now: float) -> float:
        """Take `amount` bytes (possibly into debt) and return how many seconds the caller must wait."""
        if self.unlimited:
            return 0.0
        if self._stamp is not None:
            self._tokens = min(self.burst, self._tokens + (now - self._stamp) * self.rate)
        self._stamp = now
        self._tokens -= amount
        return max(0.0, -self._tokens / self.rate)

    async def acquire(self, amount: int) -> None:
        """Wait until `amount` bytes may pass."""
        await acquire_all([self], amount)


async def acquire_all(buckets: list[TokenBucket], amount: int) -> None:
    """Pay `amount` into several buckets at once (e.g. the per-peer and the per-node cap); wait for the slowest."""
    now = trio.current_time()
    delay = max((b.reserve(amount, now) for b in buckets), default=0.0)
    if delay > 0:
        await trio.sleep(delay)
    else:
        await trio.lowlevel.checkpoint()


class Allowance:
    """A token bucket that refuses instead of waiting: `take` spends `amount` only when the bucket holds it.

    Why a second kind: received gossip cannot be told to wait (py-libp2p has already read it), so what exceeds a
    sender's allowance is dropped; the bucket never goes into debt, so one huge message cannot buy silence later.
    Pure: `now` is passed in.
    """

    def __init__(self, rate: float, burst: float) -> None:
        if rate <= 0 or burst <= 0:
            raise ValueError("an allowance needs a positive rate and burst")
        self.rate = rate
        self.burst = burst
        self._tokens = burst
        self._stamp: float | None = None

    def available(self, now: float) -> float:
        """Tokens held at `now` (refilled since the last call, capped at `burst`)."""
        if self._stamp is not None:
            self._tokens = min(self.burst, self._tokens + max(0.0, now - self._stamp) * self.rate)
        self._stamp = now
        return self._tokens

    def wait(self, amount: float, now: float) -> float:
        """Seconds until `amount` (at most `burst`) is held; 0 when it is held at `now`."""
        return max(0.0, (min(amount, self.burst) - self.available(now)) / self.rate)

    def take(self, amount: float, now: float) -> bool:
        """Spend `amount` if held at `now`; False (and nothing spent) otherwise."""
        if self.available(now) < amount:
            return False
        self._tokens -= amount
        return True
