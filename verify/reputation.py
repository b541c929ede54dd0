"""Reputation of workers (rollouts rejected) and validators (votes against the settled outcome), with bans.

Why both: a worker that publishes bad rollouts wastes validators' prefills, and a validator that votes against
the quorum is either broken or lying (accepting forged work, or rejecting honest work to slow the run). Each
settlement credits agreement a little and debits disagreement a lot, so an honest peer with rare kernel-noise
mishaps recovers, while a steady cheater crosses the ban threshold quickly. Bans are sticky: the swarm layer
drops a banned peer's messages.

Memory is bounded node-wide whatever the number of identities: at most `max_peers` scores and as many bans, the
least recently touched forgotten first among peers of the same kind (worker names are strings, validator keys
bytes), so a crowd of fresh workers never pushes a validator's score or ban out. A worker forgotten starts afresh,
which the trainer's gate answers with probation (swarm/roles/gate_probation.py).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from verify.quorum import Outcome, Settlement


@dataclass(frozen=True)
class ReputationConfig:
    """credit: added per good event; penalty: subtracted per bad event; ceiling: the most score a peer can bank
    (so a long honest history cannot pay for a burst of cheating); ban_below: a score at or under this bans;
    max_peers: the most scores, and the most bans, kept."""

    credit: float = 0.1
    penalty: float = 1.0
    ceiling: float = 2.0
    ban_below: float = -3.0
    max_peers: int = 10_000


class Reputation:
    """Scores per peer key (worker names or validator keys, any hashable)."""

    def __init__(self, config: ReputationConfig | None = None) -> None:
        self.config = config or ReputationConfig()
        self._scores: OrderedDict[object, float] = OrderedDict()  # least recently touched first
        self._banned: OrderedDict[object, None] = OrderedDict()

    def score(self, peer: object) -> float:
        return self._scores.get(peer, 0.0)

    def is_banned(self, peer: object) -> bool:
        return peer in self._banned

    def banned(self) -> frozenset:
        return frozenset(self._banned)

    def record(self, peer: object, good: bool) -> None:
        """One event for `peer`; crossing the threshold bans it for good."""
        delta = self.config.credit if good else -self.config.penalty
        value = min(self.config.ceiling, self.score(peer) + delta)
        put_bounded(self._scores, peer, value, self.config.max_peers)
        if value <= self.config.ban_below:
            put_bounded(self._banned, peer, None, self.config.max_peers)

    def settle(self, settlement: Settlement, worker: object) -> None:
        """Score the worker by the outcome and every voter by agreement with it; timeouts score nobody."""
        if settlement.outcome not in (Outcome.ACCEPTED, Outcome.REJECTED):
            return
        accepted = settlement.outcome is Outcome.ACCEPTED
        self.record(worker, accepted)
        for validator, vote in settlement.votes.items():
            self.record(validator, vote == accepted)

    def export(self) -> tuple[list[tuple[object, float]], list[object]]:
        """(scores, bans), least recently touched first: what a trainer's checkpoint keeps."""
        return list(self._scores.items()), list(self._banned)

    def load(self, scores: list[tuple[object, float]], banned: list[object]) -> None:
        """Replace the state by validated scores and bans (bounded again by this config)."""
        self._scores, self._banned = OrderedDict(), OrderedDict()
        for peer, value in scores:
            put_bounded(self._scores, peer, min(self.config.ceiling, value), self.config.max_peers)
        for peer in banned:
            put_bounded(self._banned, peer, None, self.config.max_peers)


def put_bounded(table: OrderedDict, key, value, bound: int) -> None:
    """Set `key` as the most recent entry; past `bound`, forget the least recent entry of the same kind as `key`
    (the same type), or the least recent of all when there is none."""
    table.pop(key, None)
    table[key] = value
    if len(table) > bound:
        victim = next((k for k in table if type(k) is type(key)), next(iter(table)))
        del table[victim]
