"""Which received gossip messages may be decoded at all: per-sender rate limits and CPU budgets. Pure state.

Rules of this module: events in (`admit` with `now`), a decision out (None, or the reason code of a refusal); the
gossip adapter executes it (drops the message before decoding it, never forwards it, and scores the peer the
reason names). Why before decoding: what a message costs a receiver (msgpack, the canonical re-encoding, the
signature, the typed body) grows with its size, so an allowance on bytes decoded per second is an allowance on
CPU; a message refused here costs a dictionary lookup.

The budgets, each a token bucket that refuses rather than waits (p2p.ratelimit.Allowance):
- messages per origin and kind: a peer's heartbeats at most one per `heartbeat_interval_s` in the long run, other
  kinds at their own pace (`KindRate`); the excess is refused as "rate_limited" and costs the origin;
- bytes decoded per origin (every message also costs `message_cost_bytes`, for its signatures and bookkeeping):
  one peer, whatever it sends and through whoever relays it, gets at most this much; the excess is refused as
  "flooding" and costs the origin;
- bytes decoded per forwarder (the connection a message came in on, which relays many origins): at most
  `forwarder_share` of the node's budget, so one connection cannot take all of it; the excess is refused as
  "relay_busy", which costs nobody when the forwarder relays others' messages (and counts as "flooding" when
  they are its own);
- messages of each kind from strangers, over every stranger together: an origin is a stranger until its first
  admitted message is `known_after_s` old, so any number of fresh identities together get
  `stranger_messages_per_s` of each kind (not that many times the per-origin rates), and a flood of one kind does
  not crowd out another (honest newcomers' heartbeats, under one a second from a whole run, among them); the
  excess is refused as "strangers_busy", which costs nobody (an honest newcomer may be caught in it) but counts
  against the origin's own message rate, so a stranger flooding past that rate is refused for it, and scored, as
  any flood is; peers the node knows keep their own allowances through such a flood;
- bytes decoded by the whole node: any number of fresh identities together cannot push the node past it; the
  excess is refused as "node_busy", which costs nobody (honest traffic may be caught in it).

Known origins are remembered, least recently heard forgotten first, up to `max_tracked`; an origin becomes known
only when heard again after its first admitted message is `known_after_s` old, so a crowd rotating identities adds
at most `stranger_messages_per_s` a second per kind and cannot push out a peer heard every few seconds. Strangers'
first admitted messages are kept apart, each for twice `known_after_s` whatever arrives after it (the strangers'
allowances bound how many that is): a crowd admitting fresh identities of every kind cannot push out an admitted
newcomer before it is known, which would keep it a stranger, refused with the crowd, for as long as the crowd
goes on.
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Generic, Mapping, TypeVar

from p2p.gossip.envelope import KINDS
from p2p.ratelimit import Allowance

REFUSALS = ("rate_limited", "flooding", "relay_busy", "strangers_busy", "node_busy")
BLAMELESS = ("relay_busy", "strangers_busy", "node_busy")
"""Refusals by budgets shared with others (a relay's, the strangers', the node's): honest traffic may be caught in
them, so they cost nobody (p2p.gossip.penalties), except "relay_busy" for a forwarder's own messages, which
`admit` reports as "flooding" instead."""


@dataclass(frozen=True)
class KindRate:
    """How many messages of one kind one origin may send: `per_s` in the long run, `burst` at once."""

    per_s: float
    burst: float


DEFAULT_RATES: Mapping[str, KindRate] = MappingProxyType({
    "manifest": KindRate(1.0, 4),  # one announcement per published version
    "have": KindRate(2.0, 8),
    "rollout": KindRate(4.0, 16),  # a worker's groups of a version go out in a few batches
    "rollout_ann": KindRate(4.0, 16),
    "vote": KindRate(4.0, 16),  # a validator's votes of a batch, up to 256 per message
    "heartbeat": KindRate(1 / 3.0, 2),  # replaced by `heartbeat_interval_s` (see AdmissionConfig)
})


@dataclass(frozen=True)
class AdmissionConfig:
    """Receive-side limits of one node's gossip. Bytes are envelope bytes as received; times are seconds."""

    heartbeat_interval_s: float = 3.0
    """Shortest long-run spacing of one peer's heartbeats (two may come back to back). Peers heartbeat every
    `heartbeat_every_s` (6 s by default; swarm.node.node sets this to half of it), so an honest peer never meets it."""
    rates: Mapping[str, KindRate] = field(default_factory=lambda: DEFAULT_RATES)
    """Messages per origin per kind; the heartbeat entry is replaced by `heartbeat_interval_s`."""
    sender_bytes_per_s: float = 2 * 1024 * 1024
    """Bytes one origin may have decoded per second in the long run."""
    sender_burst_bytes: float = 4 * 1024 * 1024
    """Bytes one origin may have decoded at once (four of the largest messages)."""
    forwarder_share: float = 0.5
    """Share of the node's budget (rate and burst) one forwarder's messages may take, whoever originated them."""
    node_bytes_per_s: float = 8 * 1024 * 1024
    """Bytes the whole node decodes per second at most, whoever sends them."""
    node_burst_bytes: float = 16 * 1024 * 1024
    """Bytes the whole node decodes at once at most."""
    stranger_messages_per_s: float = 50.0
    """Messages of one kind per second the node decodes from strangers (origins first heard less than
    `known_after_s` ago), all of them together. A swarm of 1,000 peers starting at once is heard within half a
    minute."""
    stranger_burst: float = 100.0
    """Messages of one kind from strangers decoded at once, all of them together."""
    known_after_s: float = 20.0
    """Seconds after its first admitted message from which an origin is known (a few heartbeats)."""
    message_cost_bytes: int = 4 * 1024
    """What each message costs in the byte budgets besides its size: two signature checks and pubsub's work."""
    max_tracked: int = 4096
    """Most senders whose buckets are kept, known origins, strangers and forwarders each; past it the least
    recently heard are forgotten (the node-wide budgets still hold for them)."""

    def __post_init__(self) -> None:
        if set(self.rates) != set(KINDS):
            raise ValueError(f"rates must name each of {KINDS}")
        if min(self.heartbeat_interval_s, self.sender_bytes_per_s, self.sender_burst_bytes, self.node_bytes_per_s,
               self.node_burst_bytes, self.max_tracked, self.forwarder_share, self.stranger_messages_per_s,
               self.stranger_burst) <= 0 or self.message_cost_bytes < 0 or self.known_after_s < 0:
            raise ValueError("admission limits must be positive")

    def rate_of(self, kind: str) -> KindRate:
        if kind == "heartbeat":
            return KindRate(1.0 / self.heartbeat_interval_s, self.rates["heartbeat"].burst)
        return self.rates[kind]


Key = TypeVar("Key", bound=Hashable)
"""What a _Buckets tracks allowances by: a peer id, or (peer id, kind)."""


class _Buckets(Generic[Key]):
    """Allowances by key, at most `capacity` of them, the least recently used forgotten first."""

    def __init__(self, capacity: int, make: Callable[[Key], Allowance]) -> None:
        self.capacity = capacity
        self._make = make
        self._by_key: collections.OrderedDict = collections.OrderedDict()

    def get(self, key: Key) -> Allowance:
        bucket = self._by_key.get(key)
        if bucket is None:
            bucket = self._by_key[key] = self._make(key)
            while len(self._by_key) > self.capacity:
                self._by_key.popitem(last=False)
        else:
            self._by_key.move_to_end(key)
        return bucket


class GossipAdmission:
    """Decides, per received message, whether it may be decoded; see the module docstring."""

    def __init__(self, config: AdmissionConfig = AdmissionConfig()) -> None:
        self.config = config
        # Known origins' buckets and strangers' apart: a crowd's fresh identities, each making buckets with every
        # message, push out only strangers' buckets, never a known peer's (which would hand it a fresh burst).
        self._rates = {known: _Buckets(config.max_tracked, lambda key: _allowance(config.rate_of(key[1])))
                       for known in (True, False)}
        self._origin_bytes = {known: _Buckets(config.max_tracked, lambda key: Allowance(
            config.sender_bytes_per_s, config.sender_burst_bytes)) for known in (True, False)}
        share = config.forwarder_share
        self._forwarder_bytes = _Buckets(config.max_tracked, lambda key: Allowance(
            config.node_bytes_per_s * share, config.node_burst_bytes * share))
        self._node = Allowance(config.node_bytes_per_s, config.node_burst_bytes)
        self._strangers = {kind: Allowance(config.stranger_messages_per_s, config.stranger_burst) for kind in KINDS}
        self._first_heard: collections.OrderedDict[str, float] = collections.OrderedDict()  # strangers, oldest first
        self._known: collections.OrderedDict[str, None] = collections.OrderedDict()  # least recently heard first

    def admit(self, kind: str, origin: str, forwarder: str, size: int, now: float) -> str | None:
        """None when a `kind` message of `size` bytes from `origin`, handed over by `forwarder`, may be decoded;
        else the refusal's reason (REFUSALS). Nothing is spent from any budget for a refused message, except a
        stranger's own message rate when the strangers' allowance refuses it."""
        cost = size + self.config.message_cost_bytes
        stranger = self._is_stranger(origin, now)
        rate = self._rates[not stranger].get((origin, kind))
        if rate.available(now) < 1:
            return "rate_limited"
        senders = [self._origin_bytes[not stranger].get(origin), self._forwarder_bytes.get(forwarder)]
        if senders[0].available(now) < cost:
            return "flooding"
        if senders[1].available(now) < cost:
            return "flooding" if forwarder == origin else "relay_busy"
        if stranger and self._strangers[kind].available(now) < 1:
            rate.take(1, now)  # a refusal that costs nobody must not hide a flood past the origin's own rate
            return "strangers_busy"
        if not self._node.take(cost, now):
            return "node_busy"
        if stranger:
            self._strangers[kind].take(1, now)
            self._first_heard.setdefault(origin, now)
            horizon = now - 2 * self.config.known_after_s
            while self._first_heard and next(iter(self._first_heard.values())) < horizon:
                self._first_heard.popitem(last=False)
        rate.take(1, now)
        for bucket in senders:
            bucket.take(cost, now)
        return None

    def _is_stranger(self, origin: str, now: float) -> bool:
        """Whether `origin` was first heard less than `known_after_s` before `now` (or never); a known origin
        counts as heard again, so it is forgotten last."""
        if origin in self._known:
            self._known.move_to_end(origin)
            return False
        first = self._first_heard.get(origin)
        if first is None or now - first < self.config.known_after_s:
            return True
        del self._first_heard[origin]
        self._known[origin] = None
        while len(self._known) > self.config.max_tracked:
            self._known.popitem(last=False)
        return False


def _allowance(rate: KindRate) -> Allowance:
    return Allowance(rate.per_s, rate.burst)


class OwnPace:
    """The publishing side of the same limits: how long our own next message of a kind must wait so that
    receivers with the same AdmissionConfig admit it (within `margin` of each rate: their clocks see our
    messages with jitter). Why: a burst an honest peer sends must slow down, never be dropped and scored."""

    def __init__(self, config: AdmissionConfig = AdmissionConfig(), margin: float = 0.8) -> None:
        self.config = config
        self._kinds = {kind: Allowance(config.rate_of(kind).per_s * margin, max(1.0, config.rate_of(kind).burst - 1))
                       for kind in KINDS}
        self._bytes = Allowance(config.sender_bytes_per_s * margin, config.sender_burst_bytes * margin)

    def delay(self, kind: str, size: int, now: float) -> float:
        """Seconds to wait before a `kind` message of `size` bytes may go (0: now)."""
        cost = size + self.config.message_cost_bytes
        return max(self._kinds[kind].wait(1, now), self._bytes.wait(cost, now))

    def record(self, kind: str, size: int, now: float) -> None:
        """Spend what the message just sent costs (after `delay` said 0)."""
        self._kinds[kind].take(1, now)
        self._bytes.take(min(self._bytes.burst, size + self.config.message_cost_bytes), now)
