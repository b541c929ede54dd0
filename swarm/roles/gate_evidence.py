"""The trainer's near-tie evidence: each worker's flips summed over the groups the gate settles, judged by the
sequential test of verify.worker_history.

Why the trainer: each validator sees only about r / V of a worker's groups (r replicas out of V validators, drawn
by slot), so a validator's own history bans a cheater only after V / r times as many groups. The trainer's gate
settles every group of every worker, and every vote carries its group's `near_ties` row (flips/tokens), so here a
worker's evidence is the sum over all its settled groups, however it spreads them over validators.

Why a median, and disputes: per settled group the rows of the votes that settle it (assigned validators only: the
quorum tracker counts no other) are combined by `combine_rows`. With three or more rows it takes their lower median,
which one lying validator can move no further than an honest row: it can neither frame an honest worker nor hide a
cheater's flips. With two rows (the default 2 of 2) the lower row enters the history, so a liar claiming flips cannot
frame anyone; but a liar claiming none would hide them, so two rows that disagree beyond what honest kernels do
(`tolerance`) make the group *disputed*: it is not trained, whoever lied, and no one is blamed. A liar thereby hides
a cheater's flips only from the history, never gets a group trained that its honest partner saw cheat, and against an
honest worker only withholds the groups it settles, as a rejecting vote would. An accepting vote without exactly one
evidence row beside a vote that carries one is a dispute too, or a liar would leave its row out instead of writing
zero. A group settled by a single vote adds nothing unless the run has one replica (that validator is the run's
whole judgement anyway).

Sans-IO: votes and settlements in, judgements out. State is bounded: at most `max_rollouts` rollouts' rows wait
for their settlement (oldest forgotten first) and WorkerHistory bounds its workers.
"""

from __future__ import annotations

from collections import OrderedDict

from verify.neartie import NO_NEAR_TIES, NearTies
from verify.quorum import Settlement
from verify.votes import Vote
from verify.worker_history import HistoryConfig, Judgement, WorkerHistory, parse_evidence_row

NEAR_TIES = "near_ties"
"""The gate's refusal reason for a group of a worker its near-tie history banned."""


class GateEvidence:
    """Per-worker near-tie histories fed by the votes of the groups the gate settles, one per precision."""

    def __init__(self, replicas: int, *, max_rollouts: int = 16_384) -> None:
        self.replicas, self.max_rollouts = replicas, max_rollouts
        self._rows: OrderedDict[bytes, dict[bytes, tuple[int, int] | None]] = OrderedDict()  # None: no row
        self._histories: dict[str, WorkerHistory] = {}

    def on_vote(self, vote: Vote) -> None:
        """Keep a vote's evidence row until its rollout settles (the first vote per validator counts); a vote
        without exactly one row (a ban's failing row, or an ambiguous vote) is kept as None."""
        rows = [row for row in map(parse_evidence_row, vote.checks) if row is not None]
        by_validator = self._rows.pop(vote.rollout_id, None) or {}
        by_validator.setdefault(vote.validator, rows[0] if len(rows) == 1 else None)
        self._rows[vote.rollout_id] = by_validator
        if len(self._rows) > self.max_rollouts:
            self._rows.popitem(last=False)

    def on_settled(self, settlement: Settlement, worker: str, precision: str) -> tuple[Judgement | None, bool]:
        """(judgement after adding the settled group's combined row to `worker`'s history, or None when the group
        carried too few rows; whether its rows are disputed)."""
        rows = self._rows.pop(settlement.rollout_id, {})
        counted = [row for validator, row in rows.items() if validator in settlement.votes and row is not None]
        silent = any(row is None and settlement.votes.get(validator) for validator, row in rows.items())
        row, disputed = combine_rows(counted, tolerance(precision, max((t for _, t in counted), default=0)),
                                     replicas=self.replicas)
        disputed = disputed or (silent and bool(counted) and self.replicas > 1)
        if row is None:
            return None, disputed
        flips, tokens = row
        record = NearTies(tokens, min(flips, tokens), NO_NEAR_TIES.gap_bins)
        return self._history(precision).observe(worker, record), disputed

    def is_banned(self, worker: str) -> bool:
        return any(h.is_banned(worker) for h in self._histories.values())

    def banned(self) -> set[str]:
        """The workers banned for their near-ties (each history remembers at most its `max_workers`)."""
        return {w for h in self._histories.values() for w in h.banned()}

    def export(self) -> dict[str, tuple[list, list]]:
        """Each precision's history as (records, bans) (WorkerHistory.export)."""
        return {precision: history.export() for precision, history in self._histories.items()}

    def load(self, histories: dict[str, tuple[list, list]]) -> None:
        """Replace the histories by validated ones (the pending rows of unsettled groups are not kept)."""
        self._histories = {}
        for precision, (records, banned) in histories.items():
            self._history(precision).load(records, banned)

    def _history(self, precision: str) -> WorkerHistory:
        if precision not in self._histories:
            self._histories[precision] = WorkerHistory(HistoryConfig.for_precision(precision))
        return self._histories[precision]


def combine_rows(rows: list[tuple[int, int]], tol: int, *, replicas: int = 2) -> tuple[tuple[int, int] | None, bool]:
    """((flips, tokens) entering the history, disputed) from one group's evidence rows: with three or more rows
    their lower median (flips and tokens each); with two the lower, disputed when their tokens differ or their flips
    differ by more than `tol`; one row counts only in a run of one replica."""
    if len(rows) < min(2, replicas):
        return None, False
    middle = (len(rows) - 1) // 2
    combined = sorted(f for f, _ in rows)[middle], sorted(t for _, t in rows)[middle]
    if len(rows) != 2:
        return combined, False
    (f1, t1), (f2, t2) = rows
    return combined, t1 != t2 or abs(f1 - f2) > tol


def tolerance(precision: str, tokens: int) -> int:
    """How many flips two honest validators' rows of a group of `tokens` may differ by: the flips an honest worker
    of `precision` makes at its rate p0 (verify.worker_history), rounded down (float32: none in a group of 256)."""
    return int(HistoryConfig.for_precision(precision).honest_flip_rate * tokens + 1e-9)
