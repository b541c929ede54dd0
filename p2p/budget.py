"""One node-wide budget of memory held for network input that is not verified yet.

Why per resource and not per peer: identities are free, so a limit per peer is no limit. Six fresh identities with
four data channels each, every one sending a preamble that declares 32 MiB and stalling just short of its end,
would take a seed from 111 to 958 MiB. Every buffer that holds bytes a peer declared but we could not check yet (a
preamble's manifest, a data-channel record before its tag is checked, a piece frame before its hash is) takes a
lease on this budget first, and a lease that would pass the limit fails the input that asked for it (that channel
or link is dropped), whoever sent it, so any number of identities together hold at most `limit` bytes this way.

Why our own accountant and not py-libp2p's resource manager (`libp2p.rcmgr`): these buffers belong to raw TCP
data sockets and to our own framing, which its scopes never see; its memory accounting also trips a circuit
breaker on wall-clock time after a few refusals (then refuses everything for 60 s), which would hand an attacker
a switch to turn the whole node's input off, and it cannot run on trio's virtual clock in tests.

Sans-IO: plain counters; callers resize their lease as their buffer grows and close it when the bytes are verified
or dropped.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
from collections.abc import Callable

from p2p.errors import ChannelError

DEFAULT_LIMIT = 64 << 20
"""Bytes of records and piece frames not yet verified a node holds at most: a few dozen pieces in flight at once,
far above what honest peers need at any moment (a piece or a record per link, briefly). With the preambles' own
32 MiB (swarm.policy.link_preamble) a node holds at most 96 MiB of unverified input, under the 150 MiB it may grow
by."""
FREE_BYTES = 64 * 1024
"""Bytes each lease holds without charge: control frames (requests, haves, a hello) must flow even while
strangers keep the budget full, or honest links would starve. Every channel owns buffers of this size anyway,
which the node-wide channel cap bounds (p2p.channel.service.ChannelConfig.max_channels)."""


TRIM_AFTER = 16 << 20
"""Bytes given back to the budget after which the process hands freed heap pages back to the system."""


class BudgetExhausted(ChannelError):
    """The node holds as much unverified input as it allows: the channel or link that asked for more is dropped.
    Not a breach by itself (an honest peer may meet a full budget), so the peer is not banned for it."""


class MemoryBudget:
    """Bytes of unverified input held now, over every lease; refuses growth past `limit`."""

    def __init__(self, limit: int = DEFAULT_LIMIT, trim: Callable[[], None] | None = None) -> None:
        if limit < 1:
            raise ValueError("a memory budget must allow at least one byte")
        self.limit = limit
        self.held = 0
        self.peak = 0
        self.refused = 0  # leases that could not grow
        self._trim = trim or return_freed_memory
        self._given_since_trim = 0

    def lease(self, what: str) -> BudgetLease:
        """A lease of zero bytes for one buffer; `what` names the input in the refusal's message."""
        return BudgetLease(self, what)

    def _take(self, size: int, what: str) -> None:
        if self.held + size > self.limit:
            self.refused += 1
            raise BudgetExhausted(f"{what} of {size} more bytes refused: the node already holds "
                                  f"{self.held >> 20} MiB of unverified input (limit {self.limit >> 20} MiB)")
        self.held += size
        self.peak = max(self.peak, self.held)

    def _give(self, size: int) -> None:
        self.held -= size
        self._given_since_trim += size
        if self._given_since_trim >= TRIM_AFTER:
            self._given_since_trim = 0
            self._trim()


class BudgetLease:
    """The bytes one buffer holds on a MemoryBudget; usable as a context manager that closes it."""

    def __init__(self, budget: MemoryBudget, what: str) -> None:
        self.budget = budget
        self.what = what
        self.size = 0

    def resize(self, size: int) -> None:
        """Hold `size` bytes from now on (the first FREE_BYTES uncharged): growing past the budget raises
        BudgetExhausted (nothing changes then)."""
        charged, now = max(0, size - FREE_BYTES), max(0, self.size - FREE_BYTES)
        if charged > now:
            self.budget._take(charged - now, self.what)
        elif charged < now:
            self.budget._give(now - charged)
        self.size = size

    def close(self) -> None:
        self.resize(0)

    def __enter__(self) -> BudgetLease:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


class ByteRate:
    """Bytes per second a node reads of one kind of unverified input, over every channel: a token bucket.

    Why: a byte limit held at once bounds memory, not CPU. Every byte a channel delivers is decrypted before
    anyone can tell it is worthless, and channels dropped for a full budget are reopened at once: sixteen fresh
    identities push 600 MiB of stalled preambles through a target in 20 s (13 % of a core, a third of it
    reading and decrypting them). Readers reserve bytes here before they read them; a reader whose bytes would
    come later than `max_wait` seconds from now is refused before it reads anything (BudgetExhausted), so any
    number of identities together get at most `rate` bytes per second (plus `burst` once) read this way.

    Sans-IO: the caller passes the time (trio.current_time()) and sleeps for the wait it is given."""

    def __init__(self, rate: float, burst: int, max_wait: float) -> None:
        if rate <= 0 or burst < 1 or max_wait < 0:
            raise ValueError("a byte rate needs a positive rate and burst and a wait not negative")
        self.rate, self.burst, self.max_wait = rate, burst, max_wait
        self.refused = 0  # reservations refused
        self._level = float(burst)  # bytes that may be read now; negative while readers wait for their turn
        self._at: float | None = None

    def reserve(self, size: int, what: str, now: float) -> float:
        """Take `size` bytes; returns the seconds to wait before reading them. BudgetExhausted (nothing taken)
        when that wait would pass `max_wait`."""
        self._refill(now)
        wait = max(0.0, (size - self._level) / self.rate)
        if wait > self.max_wait:
            self.refused += 1
            raise BudgetExhausted(f"{what} refused: the node reads at most {self.rate / (1 << 20):g} MiB/s of "
                                  "such input and that is spent")
        self._level -= size
        return wait

    def give_back(self, size: int, now: float) -> None:
        """Return bytes reserved but not read (the channel ended or sent less)."""
        self._refill(now)
        self._level = min(float(self.burst), self._level + size)

    def _refill(self, now: float) -> None:
        if self._at is None or now < self._at:  # first use, or another trio run's clock: a full bucket
            self._level = float(self.burst)
        else:
            self._level = min(float(self.burst), self._level + (now - self._at) * self.rate)
        self._at = now


def return_freed_memory() -> None:
    """Hand the heap's free pages back to the system (glibc's malloc_trim; nothing elsewhere).

    Why: the chunks of a dropped preamble are freed, but glibc serves such 1 MiB blocks from its heap after the
    first is freed (its mmap threshold rises) and keeps freed heap pages: measured, six identities' stalled
    preambles leave a peer 42 MiB above its baseline with nothing held, 9 MiB with the trim. Called once per
    TRIM_AFTER bytes given back, it costs a few ms."""
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    name = ctypes.util.find_library("c")
    try:
        return ctypes.CDLL(name).malloc_trim if name else None
    except (OSError, AttributeError):  # not glibc (musl, macOS): the allocator returns memory its own way
        return None


NODE_BUDGET = MemoryBudget()
"""The budget every data channel, preamble and piece link of this process charges unless given another: one node
per process (a simulation of many peers in one process shares it, all of them being loopback peers we run)."""
