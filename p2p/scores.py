"""Peer scoring for gossip: pure state. Rejections push a peer's score down; below a threshold it is banned.

Rules of this module: events in (`penalize`, `tick`), decisions out (`Verdict`, the list of bans that ended); the
caller passes `now` and executes the decisions (the gossip adapter blacklists and disconnects a banned peer, and
lifts the blacklist when the ban ends). Why decay: a peer that once relayed a stale heartbeat after a clock hiccup
must not carry that forever, while a peer that keeps sending forgeries sinks faster than it recovers. Why penalties
per reason: a bad signature or garbage bytes is never an accident; a stale or replayed message can be.
"""

from __future__ import annotations

import enum
import heapq
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Mapping

DEFAULT_PENALTIES: Mapping[str, float] = MappingProxyType({
    "malformed": 20.0,
    "bad_signature": 20.0,
    "bad_version": 5.0,
    "unknown_kind": 5.0,
    "oversized": 10.0,
    "wrong_run": 5.0,
    "too_old": 1.0,
    "from_future": 2.0,
    "replayed": 1.0,
    "wrong_sender": 20.0,  # an envelope signed by another peer than the one that published it
    "bad_body": 20.0,  # a body its kind's typed decoder refuses: a correct peer never sends one
    "handler_error": 10.0,  # a message that made a handler fail: dropped, and its sender pays
    "ignored": 10.0,  # a message a handler could not use (an announced manifest that does not verify)
    "rate_limited": 5.0,  # more messages of a kind than its rate allows (twelve past it: banned)
    "flooding": 5.0,  # more bytes than a sender's decode budget
    "handler_fault": 25.0,  # a stream of the peer made a handler of the host fail (p2p.host): three ban it, as there
})


@dataclass(frozen=True)
class ScoreConfig:
    """How hard each kind of misbehaviour counts, and how long it is remembered."""

    penalties: Mapping[str, float] = field(default_factory=lambda: DEFAULT_PENALTIES)
    """Score lost per rejected envelope, by EnvelopeError reason; unknown reasons cost `default_penalty`."""
    default_penalty: float = 10.0
    """Penalty for a reason missing from `penalties`."""
    ban_threshold: float = -60.0
    """A peer whose score drops to or below this is banned (three forgeries in a row, sixty stale messages)."""
    half_life_s: float = 120.0
    """Seconds for a negative score to decay halfway back to zero."""
    ban_s: float = 600.0
    """How long a ban lasts before the peer may talk again (with a clean score)."""
    max_peers: int = 10_000
    """Peers tracked at once; past it by an eighth, the mildest scores are forgotten down to it (memory stays
    bounded)."""

    def __post_init__(self) -> None:
        if self.ban_threshold >= 0 or self.half_life_s <= 0 or self.ban_s <= 0 or self.max_peers <= 0:
            raise ValueError("ban_threshold must be negative; half_life_s, ban_s and max_peers positive")


class Verdict(enum.Enum):
    """What the adapter must do with the peer after an event."""

    KEEP = "keep"
    BAN = "ban"


class PeerScores:
    """Scores of the peers that sent us bad envelopes (peers never penalised are not tracked at all)."""

    def __init__(self, config: ScoreConfig = ScoreConfig()) -> None:
        self.config = config
        self._scores: dict[str, tuple[float, float]] = {}  # peer -> (score, time it was last updated)
        self._banned_until: dict[str, float] = {}

    def score(self, peer: str, now: float) -> float:
        """The peer's decayed score at `now` (0 for a peer in good standing)."""
        value, since = self._scores.get(peer, (0.0, now))
        return value * 0.5 ** (max(0.0, now - since) / self.config.half_life_s)

    def is_banned(self, peer: str, now: float) -> bool:
        return self._banned_until.get(peer, float("-inf")) > now

    def penalize(self, peer: str, reason: str, now: float) -> Verdict:
        """Record one rejected envelope from `peer`; BAN when the score crosses the threshold (the adapter then
        blacklists and disconnects it). A peer already banned stays banned and gets BAN again."""
        if self.is_banned(peer, now):
            return Verdict.BAN
        penalty = self.config.penalties.get(reason, self.config.default_penalty)
        value = self.score(peer, now) - penalty
        if value <= self.config.ban_threshold:
            self._scores.pop(peer, None)
            self._banned_until[peer] = now + self.config.ban_s
            return Verdict.BAN
        self._scores[peer] = (value, now)
        self._bound(now)
        return Verdict.KEEP

    def tick(self, now: float) -> list[str]:
        """Lift the bans that ended by `now` and return those peers (the adapter removes them from its blacklist)."""
        ended = [peer for peer, until in self._banned_until.items() if until <= now]
        for peer in ended:
            del self._banned_until[peer]
        return ended

    def banned(self, now: float) -> list[str]:
        return [peer for peer, until in self._banned_until.items() if until > now]

    def _bound(self, now: float) -> None:
        """Keep at most `max_peers` scores, and an eighth more between trims: past that, forget the ones closest
        to zero, i.e. the least suspicious, down to `max_peers`. Why in batches: every refused message is a
        penalty, and choosing the mildest of a full table at each one cost 14 ms per penalty at 10,000 identities;
        a batch costs one selection per max_peers / 8 new peers."""
        excess = len(self._scores) - self.config.max_peers
        if excess <= self.config.max_peers // 8:
            return
        for peer in heapq.nlargest(excess, self._scores, key=lambda peer: self.score(peer, now)):
            del self._scores[peer]
