"""The trainer's near-tie evidence: each worker's flips summed over the groups the gate settles, judged by the
sequential test of verify.worker_history.

Why the trainer: each validator sees only about r / V of a worker's groups (r replicas out of V validators, drawn
by slot), so a validator's own history bans a cheater only after V / r times as many groups. The trainer's gate
settles every group of every worker, and every vote carries its group's `near_ties` row (flips/tokens), so here a
worker's evidence is the sum over all its settled groups, however it spreads them over validators.

Why a median: per settled group the rows of the votes that settled it (assigned validators only: the quorum
tracker counts no other) are reduced to their lower median. With two or more rows, one lying validator can move
it no further than an honest row, so it cannot frame an honest worker; with three rows it cannot hide a cheater's
flips either, while with two (the default 2 of 2) the lower median is the smaller row, so a validator colluding
with a worker hides the flips of the groups it settles (docs/security.md). A group settled by a single vote adds
nothing unless the run has one replica (that validator is the run's whole judgement anyway).

Sans-IO: votes and settlements in, judgements out. State is bounded: at most `max_rollouts` rollouts' rows wait
for their settlement (oldest forgotten first) and WorkerHistory bounds its workers.
"""

from __future__ import annotations

from collections import OrderedDict

from verify.neartie import NO_NEAR_TIES, NearTies
from verify.worker_history import HistoryConfig, Judgement, WorkerHistory, parse_evidence_row

NEAR_TIES = "near_ties"
"""The gate's refusal reason for a group of a worker its near-tie history banned."""


class GateEvidence:
    """Per-worker near-tie histories fed by the votes of the groups the gate settles, one per precision."""

    def __init__(self, replicas: int, *, max_rollouts: int = 16_384) -> None:
        self.replicas, self.max_rollouts = replicas, max_rollouts
        self._rows: OrderedDict[bytes, dict[bytes, tuple[int, int]]] = OrderedDict()
        self._histories: dict[str, WorkerHistory] = {}

    def on_vote(self, vote) -> None:
        """Keep a vote's evidence row until its rollout settles (the first row per validator counts)."""
        rows = [row for row in map(parse_evidence_row, vote.checks) if row is not None]
        if len(rows) != 1:  # no evidence (a group never prefilled, or a ban's failing row), or an ambiguous vote
            return
        by_validator = self._rows.pop(vote.rollout_id, None) or {}
        by_validator.setdefault(vote.validator, rows[0])
        self._rows[vote.rollout_id] = by_validator
        if len(self._rows) > self.max_rollouts:
            self._rows.popitem(last=False)

    def on_settled(self, settlement, worker: str, precision: str) -> Judgement | None:
        """Add the settled group's median row to `worker`'s history; None when the group carried too few rows."""
        rows = self._rows.pop(settlement.rollout_id, {})
        counted = [row for validator, row in rows.items() if validator in settlement.votes]
        if len(counted) < min(2, self.replicas):
            return None
        middle = (len(counted) - 1) // 2
        flips = sorted(f for f, _ in counted)[middle]
        tokens = sorted(t for _, t in counted)[middle]
        record = NearTies(tokens, min(flips, tokens), NO_NEAR_TIES.gap_bins)
        return self._history(precision).observe(worker, record)

    def is_banned(self, worker: str) -> bool:
        return any(h.is_banned(worker) for h in self._histories.values())

    def banned(self) -> set[str]:
        """The workers banned for their near-ties (each history remembers at most its `max_workers`)."""
        return {w for h in self._histories.values() for w in h.banned()}

    def _history(self, precision: str) -> WorkerHistory:
        if precision not in self._histories:
            self._histories[precision] = WorkerHistory(HistoryConfig.for_precision(precision))
        return self._histories[precision]
