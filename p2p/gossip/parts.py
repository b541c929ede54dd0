"""Gossip's small sans-IO parts: counters, the record of a refusal, the publish pacer and bounded maps.

Kept apart from p2p.gossip.service (the IO adapter) so each file holds one idea; p2p.gossip.service re-exports what
callers use.
"""

from __future__ import annotations

import collections
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, TypeVar

if TYPE_CHECKING:  # libp2p is heavy to import (tests/test_import_contract.py); these name what py-libp2p stores
    from libp2p.pubsub.pb import rpc_pb2
    from libp2p.pubsub.pubsub import ValidationResult

K = TypeVar("K")
V = TypeVar("V")


@dataclass
class GossipStats:
    """Counters for reports and the status view."""

    published: int = 0
    delivered: int = 0
    bytes_published: int = 0  # envelope bytes of our own publishes
    bytes_delivered: int = 0  # envelope bytes of verified messages handed to subscribers
    dropped_slow_consumer: int = 0
    backpressure_waits: int = 0
    rejected: collections.Counter = field(default_factory=collections.Counter)
    bans: int = 0


@dataclass(frozen=True)
class Rejection:
    """One refused envelope, for logs and the status view."""

    peer: str
    """The peer that handed it to us (the one scored down)."""
    reason: str
    """EnvelopeError reason code."""
    banned: bool
    """True if this rejection got the peer banned (or it already was)."""


class PublishPacer:
    """Sans-IO pacing of our own sends: at most `rate` per topic in any `window_s`-second window (sliding, so a
    receiver's fixed-window limiter of the same size never sees more)."""

    def __init__(self, rate: float, window_s: float = 1.0) -> None:
        self.rate = rate
        self.window_s = window_s
        self._sent: dict[str, collections.deque[float]] = collections.defaultdict(collections.deque)

    def delay(self, topic: str, now: float) -> float:
        """Seconds to wait before the next send on `topic` stays within the rate (0 if it may go now)."""
        sent = self._sent[topic]
        while sent and sent[0] <= now - self.window_s:
            sent.popleft()
        if len(sent) < max(1, int(self.rate)):
            return 0.0
        return sent[0] + self.window_s - now

    def record(self, topic: str, now: float) -> None:
        self._sent[topic].append(now)


class _NeverStored(dict[bytes, "rpc_pb2.Message"]):
    """Stands in for GossipSub.equivocation_detection: remembers nothing, so it can never grow."""

    def __setitem__(self, key: bytes, value: rpc_pb2.Message) -> None:
        return None


class _BoundedMap(collections.OrderedDict[K, V]):
    """Insertion-ordered map that forgets its oldest entries past `capacity`."""

    def __init__(self, capacity: int) -> None:
        super().__init__()
        self.capacity = capacity

    def __setitem__(self, key: K, value: V) -> None:
        super().__setitem__(key, value)
        while len(self) > self.capacity:
            self.popitem(last=False)


class _NoValidationCache:
    """Stands in for py-libp2p's ValidationCache: remembers no verdict, so every copy of a message meets our
    validator (see p2p.gossip.service: a cached refusal skips it and costs a full text dump of the message)."""

    def get(self, msg_id: bytes) -> None:
        return None

    def put(self, msg_id: bytes, result: ValidationResult) -> None:
        return None

    def clear_expired(self) -> None:
        return None
