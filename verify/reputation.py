"""Reputation of workers (rollouts rejected) and validators (votes against the settled outcome), with bans.

Why both: a worker that publishes bad rollouts wastes validators' prefills, and a validator that votes against
the quorum is either broken or lying (accepting forged work, or rejecting honest work to slow the run). Each
settlement credits agreement a little and debits disagreement a lot, so an honest peer with rare kernel-noise
mishaps recovers, while a steady cheater crosses the ban threshold quickly. Bans are sticky: the swarm layer
drops a banned peer's messages.
"""

from __future__ import annotations

from dataclasses import dataclass

from verify.quorum import Outcome, Settlement


@dataclass(frozen=True)
class ReputationConfig:
    """credit: added per good event; penalty: subtracted per bad event; ceiling: the most score a peer can bank
    (so a long honest history cannot pay for a burst of cheating); ban_below: a score at or under this bans."""

    credit: float = 0.1
    penalty: float = 1.0
    ceiling: float = 2.0
    ban_below: float = -3.0


class Reputation:
    """Scores per peer key (worker names or validator keys, any hashable)."""

    def __init__(self, config: ReputationConfig | None = None) -> None:
        self.config = config or ReputationConfig()
        self._scores: dict[object, float] = {}
        self._banned: set[object] = set()

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
        self._scores[peer] = value
        if value <= self.config.ban_below:
            self._banned.add(peer)

    def settle(self, settlement: Settlement, worker: object) -> None:
        """Score the worker by the outcome and every voter by agreement with it; timeouts score nobody."""
        if settlement.outcome not in (Outcome.ACCEPTED, Outcome.REJECTED):
            return
        accepted = settlement.outcome is Outcome.ACCEPTED
        self.record(worker, accepted)
        for validator, vote in settlement.votes.items():
            self.record(validator, vote == accepted)
