"""A worker's history decides what one group cannot: a sequential test on its near-tie flips across groups.

Why: the sampling check lets each group flip up to 1 % of its tokens at near-ties (score gap up to 0.02), because
honest kernels differ. That allowance is a budget a cheater spends in every group: a worker that decodes with a
cheaper copy of the policy and rebuilds proofs and logprobs from the right one passes whenever its flips happen to
fit, and a worker that steers every near-tie it finds passes always. Honest workers flip far less often than the
allowance (measured below), so a worker's flips summed over its groups tell the two apart.

The test (a mixture sequential probability ratio test). Under H0 each re-derived token of an honest worker flips
independently with probability at most p0 (`honest_flip_rate`). For a fixed alternative p1 > p0, the likelihood
ratio after N tokens with F flips,
    LR(p1) = (p1 / p0)^F * ((1 - p1) / (1 - p0))^(N - F),
is a non-negative martingale of mean 1 under H0 (a supermartingale when the true rate is below p0), and so is the
equal-weight mixture M = mean_k LR(p_k) over the fixed alternatives p_k = m_k * p0 (m_k in `alternatives`). By
Ville's inequality, P_H0(M ever reaches 1 / alpha) <= alpha, however many groups are looked at and whenever the
looks happen. A worker is banned the first time ln M >= ln(1 / alpha). The mixture spares a guess of the cheater's
rate: a cheater flipping at rate q is banned at about ln(K / alpha) / KL(q || p_k) tokens for its best p_k.

Rates and alpha. alpha = 1e-6 (`false_ban`) bounds the false-ban probability over a worker's whole life, so it
bounds it per worker-hour too, whatever the number of groups per hour (one a second, 3,600 an hour, is covered as
well as ten an hour); no reset is needed. p0 per precision comes from `swarm bench verify --history only` (honest
production-backend workers, the verifier's batched prefill, tiny model, 2,000 groups of 4 x 64 tokens at
temperature 0.8): float32 workers flipped 0 of 453,188 tokens (no group rejected under either TOPLOC profile; the
sampling check does not depend on the proof profile), bfloat16 workers 3,346 of 452,699 (0.74 %). p0 sits well
above each: float32 1e-4 (the measured rate's 95 % upper bound is 6.6e-6, and float32 kernels on other hardware
are noisier than one CPU's), bfloat16 2 % (SmolLM2's bf16 workers flip 1.6 %, see CheckConfig.for_precision).
Two caveats make the margin necessary: honest flips cluster in groups with many near-ties (not quite independent),
and an honest rate above p0 is still safe only up to the smallest alternative's break-even rate (about 2.2 p0 for
m = 4), beyond which the evidence drifts up.

Where this state lives, and why spreading groups over validators does not help a cheater. Each validator keeps
one (this module is pure state; swarm/roles/validator.py feeds it every verdict it reaches, rejects a banned
worker's group with the reason `near_ties` and fetches none of its later groups). That alone is not enough: with
r replicas out of V validators each sees about r / V of a worker's groups, and the validators of a group follow
from its rollout id by rendezvous hashing (verify/votes.py), which a worker can steer by grinding the group's
bytes (a jittered logprob) as long as the id is the bytes. So every vote carries the group's evidence (the
`near_ties` check row, `evidence_row`: flips and tokens), and the trainer's gate sums a worker's evidence over
every group it settles with the same test (swarm/roles/gate_evidence.py: per group the lower median of the settling
votes' rows), so a worker gains nothing by spreading its groups, and one lying validator cannot frame an honest
worker. `VoteEvidence` does the same for a peer that reads every vote without settling quorums (it waits for all
`replicas` votes of a rollout, so with three replicas one liar can hide no cheater's flips either).

Memory is bounded: a record is a few integers per worker, and at most `max_workers` records are kept (the least
recently seen worker is forgotten first); banned workers are kept in a set of the same bound.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from dataclasses import dataclass

from verify.neartie import NO_NEAR_TIES, NearTies, near_ties_of
from verify.verdicts import CheckResult, Verdict

EVIDENCE_ROW = "near_ties"


@dataclass(frozen=True)
class HistoryConfig:
    """honest_flip_rate: p0, the most flips per re-derived token an honest worker of this precision makes;
    alternatives: the rates the mixture test weighs, as multiples of p0 (each capped at `max_alternative`);
    false_ban: alpha, the largest probability that an honest worker is ever banned;
    max_workers: the most workers (and banned workers) remembered."""

    honest_flip_rate: float = 1e-4
    alternatives: tuple[float, ...] = (4.0, 16.0, 64.0, 256.0)
    max_alternative: float = 0.5
    false_ban: float = 1e-6
    max_workers: int = 10_000

    @classmethod
    def for_precision(cls, precision: str, **overrides) -> "HistoryConfig":
        """The honest rate of workers generating in `precision` (see the module docstring for the figures)."""
        rates = {"float32": 1e-4, "bfloat16": 2e-2}
        if precision not in rates:
            raise ValueError(f"unknown precision {precision!r}: choose from {', '.join(rates)}")
        return cls(**{"honest_flip_rate": rates[precision], **overrides})

    def rates(self) -> tuple[float, ...]:
        return tuple(min(self.max_alternative, m * self.honest_flip_rate) for m in self.alternatives)


@dataclass(frozen=True)
class Judgement:
    """banned: the worker is banned (now or before); newly_banned: this group crossed the threshold;
    log_evidence: ln M after this group; groups / tokens / flips: the worker's totals; reason: one sentence."""

    banned: bool
    newly_banned: bool
    log_evidence: float
    groups: int
    tokens: int
    flips: int
    reason: str = ""


class _Record:
    __slots__ = ("groups", "total")

    def __init__(self) -> None:
        self.groups, self.total = 0, NO_NEAR_TIES


def log_evidence(config: HistoryConfig, tokens: int, flips: int) -> float:
    """ln of the mixture likelihood ratio after `tokens` re-derived tokens with `flips` flips."""
    p0 = config.honest_flip_rate
    logs = [flips * math.log(p1 / p0) + (tokens - flips) * math.log((1 - p1) / (1 - p0)) for p1 in config.rates()]
    top = max(logs)
    return top + math.log(sum(math.exp(x - top) for x in logs) / len(logs))


class WorkerHistory:
    """Per-worker near-tie totals and the ban decision (pure state: feed it records, read its judgements)."""

    def __init__(self, config: HistoryConfig | None = None) -> None:
        self.config = config or HistoryConfig()
        self._threshold = math.log(1 / self.config.false_ban)
        self._records: OrderedDict[str, _Record] = OrderedDict()
        self._banned: OrderedDict[str, str] = OrderedDict()

    def is_banned(self, worker: str) -> bool:
        return worker in self._banned

    def ban_reason(self, worker: str) -> str:
        return self._banned.get(worker, "")

    def banned(self) -> tuple[str, ...]:
        """The banned workers remembered, oldest ban first."""
        return tuple(self._banned)

    def totals(self, worker: str) -> tuple[int, NearTies]:
        """(groups, summed near-tie record) seen from `worker`."""
        record = self._records.get(worker)
        return (record.groups, record.total) if record else (0, NO_NEAR_TIES)

    def observe(self, worker: str, near_ties: NearTies) -> Judgement:
        """Add one group's record to `worker`'s history and judge the worker."""
        record = self._records.pop(worker, None) or _Record()
        self._records[worker] = record  # most recently seen last
        if len(self._records) > self.config.max_workers:
            self._records.popitem(last=False)
        record.groups += 1
        record.total = record.total + near_ties
        tokens, flips = record.total.tokens, record.total.flips
        evidence = log_evidence(self.config, tokens, flips)
        was_banned = worker in self._banned
        if not was_banned and evidence >= self._threshold:
            self._ban(worker, f"{flips} of {tokens} tokens over {record.groups} groups are not the seeded sample, "
                              f"beyond the honest rate {self.config.honest_flip_rate:g} (evidence {evidence:.1f} >= "
                              f"{self._threshold:.1f})")
        banned = worker in self._banned
        return Judgement(banned, banned and not was_banned, evidence, record.groups, tokens, flips,
                         self._banned.get(worker, ""))

    def export(self) -> tuple[list[tuple[str, int, int, int]], list[tuple[str, str]]]:
        """((worker, groups, tokens, flips) per record, (worker, reason) per ban), least recently seen first."""
        records = [(w, r.groups, r.total.tokens, r.total.flips) for w, r in self._records.items()]
        return records, list(self._banned.items())

    def load(self, records: list[tuple[str, int, int, int]], banned: list[tuple[str, str]]) -> None:
        """Replace the state by validated records and bans (bounded again by this config; a record keeps its totals,
        not its gap bins, which the test does not read)."""
        self._records, self._banned = OrderedDict(), OrderedDict()
        for worker, groups, tokens, flips in records[-self.config.max_workers:]:
            record = self._records[worker] = _Record()
            record.groups, record.total = groups, NearTies(tokens, flips, NO_NEAR_TIES.gap_bins)
        for worker, reason in banned:
            self._ban(worker, reason)

    def _ban(self, worker: str, reason: str) -> None:
        self._banned[worker] = reason
        if len(self._banned) > self.config.max_workers:
            self._banned.popitem(last=False)


def evidence_row(near_ties: NearTies | None) -> tuple[str, bool, str]:
    """The vote's check row carrying one group's evidence: (EVIDENCE_ROW, True, 'FLIPS/TOKENS')."""
    record = near_ties or NO_NEAR_TIES
    return EVIDENCE_ROW, True, f"{record.flips}/{record.tokens}"


def parse_evidence_row(row) -> tuple[int, int] | None:
    """(flips, tokens) from a vote's `near_ties` check row; None when the row is not one or is malformed."""
    try:
        name, _, text = row
        if name != EVIDENCE_ROW or not isinstance(text, str) or len(text) > 40:
            return None
        flips, tokens = (int(x) for x in text.split("/"))
    except (TypeError, ValueError):
        return None
    return (flips, tokens) if 0 <= flips <= tokens else None


def judge_verdict(history: WorkerHistory, worker: str, verdict):
    """`verdict` (verify.verifier.Verdict) with a `near_ties` row appended after the worker's history took in its
    sampling evidence: a passing row carrying the evidence (`evidence_row`), or, once the worker is banned, a
    failing row naming why, which rejects the group. Returns (verdict, judgement or None when the group carried
    no evidence: it was never prefilled)."""
    record = near_ties_of(verdict)
    judgement = history.observe(worker, record) if record is not None else None
    if history.is_banned(worker):
        row = CheckResult(EVIDENCE_ROW, False, history.ban_reason(worker))
    else:
        row = CheckResult(*evidence_row(record))
    return Verdict(verdict.rollout_id, verdict.accepted and row.ok, verdict.checks + (row,)), judgement


class VoteEvidence:
    """A worker's near-tie evidence summed across validators from their votes (for a peer that reads every vote:
    the trainer's gate, or any validator), so spreading groups over many validators gains a worker nothing.

    Per rollout, once `replicas` of its validators have voted, the median of their `near_ties` rows (the lower
    median for an even count) enters the worker's history: with three replicas one lying validator can neither
    frame an honest worker nor hide a cheater's flips. The caller passes only votes of validators assigned to the
    rollout (the gate already checks that) and the worker named by the rollout itself; at most `max_pending`
    rollouts wait for their votes, the oldest forgotten first."""

    def __init__(self, config: HistoryConfig | None = None, *, replicas: int = 3, max_pending: int = 4096) -> None:
        self.history = WorkerHistory(config)
        self.replicas, self.max_pending = replicas, max_pending
        self._pending: OrderedDict[bytes, tuple[str, dict[bytes, tuple[int, int]]]] = OrderedDict()

    def on_vote(self, worker: str, rollout_id: bytes, validator: bytes, checks) -> Judgement | None:
        """Take one vote's check rows; returns the worker's judgement when this vote completed the rollout."""
        rows = [row for row in map(parse_evidence_row, checks) if row is not None]
        if len(rows) != 1:  # a vote without evidence, or with two rows, says nothing about the worker
            return None
        owner, votes = self._pending.get(rollout_id) or (worker, {})
        if owner != worker:
            return None
        votes.setdefault(validator, rows[0])
        self._pending[rollout_id] = (owner, votes)
        if len(self._pending) > self.max_pending:
            self._pending.popitem(last=False)
        if len(votes) < self.replicas:
            return None
        del self._pending[rollout_id]
        middle = (len(votes) - 1) // 2
        flips = sorted(f for f, _ in votes.values())[middle]
        tokens = sorted(t for _, t in votes.values())[middle]
        return self.history.observe(worker, NearTies(tokens, min(flips, tokens), NO_NEAR_TIES.gap_bins))
