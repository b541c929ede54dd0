"""A worker's near-tie history: the sequential test on simulated workers (fixed seeds), the evidence the sampling
check records on real tiny-model generation, the near-tie steering attack banned by it, and the validator's wiring."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from swarm.bench import attacks
from verify.checks import CheckConfig, CheckResult, RunContext
from verify.neartie import GAP_EDGES, NO_NEAR_TIES, NearTies, count_near_ties, near_ties_of
from verify.testing import GymTasks, honest_group, tiny_model
from verify.verifier import Verdict, verify_groups
from verify.worker_history import (
    HistoryConfig,
    WorkerHistory,
    evidence_row,
    judge_verdict,
    log_evidence,
    parse_evidence_row,
)

pytestmark = pytest.mark.usefixtures("one_torch_thread")

VERSION = 5
MANIFESTS = {v: bytes([v]) * 32 for v in range(8)}
TOKENS_PER_GROUP = 4 * 64


def record(tokens: int, flips: int) -> NearTies:
    bins = [0] * (len(GAP_EDGES) + 1)
    bins[5] = flips
    return NearTies(tokens, flips, tuple(bins))


def groups_until_ban(history: WorkerHistory, worker: str, flips_per_group, limit: int = 20) -> int | None:
    for n, flips in enumerate(flips_per_group[:limit], start=1):
        if history.observe(worker, record(TOKENS_PER_GROUP, int(flips))).newly_banned:
            return n
    return None


@pytest.mark.parametrize("precision", ["float32", "bfloat16"])
def test_a_worker_flipping_at_the_honest_rate_is_never_banned(precision):
    """1,000 workers x 200 groups of 256 tokens, every token flipping at the configured honest rate p0 (above the
    measured one): the mixture likelihood ratio is a mean-one martingale, so a ban here would need odds of 1e-6."""
    config = HistoryConfig.for_precision(precision)
    flips = np.random.default_rng(7).binomial(TOKENS_PER_GROUP, config.honest_flip_rate, size=(1000, 200))
    totals = flips.cumsum(axis=1)[:, ::5]
    tokens = TOKENS_PER_GROUP * np.arange(1, 201)[::5]
    worst = max(log_evidence(config, int(n), int(f)) for row in totals for n, f in zip(tokens, row))
    assert worst < -np.log(config.false_ban) - 3  # the most evidence any honest worker reached stays far below
    history = WorkerHistory(config)
    assert all(groups_until_ban(history, f"w{i}", row, limit=200) is None for i, row in enumerate(flips[:100]))


def test_a_worker_steering_its_near_tie_allowance_is_banned_within_20_groups():
    """A steerer flips up to 1 % of a group's tokens, an int8 decoder about one token a group: both are banned
    long before 20 groups, though every one of their groups fits the per-group allowance."""
    config = HistoryConfig.for_precision("float32")
    rng = np.random.default_rng(3)
    steering = rng.binomial(2, 0.9, size=(100, 20))  # 2 allowed flips of 256 tokens, near-ties found 90 % of the time
    one_a_group = rng.binomial(1, 0.8, size=(100, 20))
    for pattern in (steering, one_a_group):
        history = WorkerHistory(config)
        bans = [groups_until_ban(history, f"w{i}", row) for i, row in enumerate(pattern)]
        assert all(b is not None and b <= 20 for b in bans), bans
        assert all(history.is_banned(f"w{i}") for i in range(100))
    assert "beyond the honest rate" in history.ban_reason("w0")


def test_a_bfloat16_worker_steering_its_wider_allowance_is_banned_within_20_groups():
    config = HistoryConfig.for_precision("bfloat16")
    flips = np.random.default_rng(4).binomial(TOKENS_PER_GROUP, 0.06, size=(100, 20))  # the bf16 allowance: 6 %
    history = WorkerHistory(config)
    assert all(groups_until_ban(history, f"w{i}", row) is not None for i, row in enumerate(flips))


def test_the_history_forgets_the_least_recently_seen_worker_beyond_its_bound():
    history = WorkerHistory(HistoryConfig(max_workers=3))
    for i in range(5):
        history.observe(f"w{i}", record(100, 0))
    history.observe("w2", record(100, 0))
    assert [w for w in (f"w{i}" for i in range(5)) if history.totals(w)[0]] == ["w2", "w3", "w4"]
    for i in range(5):
        history.observe(f"cheat{i}", record(100, 100))
    assert sum(history.is_banned(f"cheat{i}") for i in range(5)) == 3  # banned workers are bounded too


def test_a_groups_record_counts_flips_by_gap():
    gaps = torch.tensor([0.0, 0.0, 5e-7, 3e-3, 0.015, float("nan"), 0.8, -0.0])
    got = count_near_ties(gaps)
    assert got.tokens == 8 and got.flips == 5 and got.gap_bins[0] == 1 and got.gap_bins[4] == 1 and got.gap_bins[6] == 1
    assert got.gap_bins[-1] == 2  # 0.8 and NaN
    assert count_near_ties(torch.zeros(4)) == NearTies(4, 0, NO_NEAR_TIES.gap_bins)


def test_the_votes_evidence_row_round_trips_and_hostile_rows_parse_to_nothing():
    assert parse_evidence_row(evidence_row(record(256, 3))) == (3, 256)
    assert parse_evidence_row(evidence_row(None)) == (0, 0)
    for row in [("near_ties", True, "5/3"), ("near_ties", True, "-1/3"), ("near_ties", True, "1/2/3"),
                ("near_ties", True, "x" * 100), ("sampling", True, "1/2"), ("near_ties", True, 7), None, ("a",)]:
        assert parse_evidence_row(row) is None, row


def test_a_banned_workers_group_is_rejected_with_the_named_reason():
    history = WorkerHistory(HistoryConfig())
    sampling = CheckResult("sampling", True, near_ties=record(256, 3))
    accepted = Verdict(b"r" * 32, True, (CheckResult("schema", True), sampling))
    first, judgement = judge_verdict(history, "w", accepted)
    assert first.accepted and first.checks[-1] == CheckResult("near_ties", True, "3/256")
    assert judgement is not None and not judgement.banned
    for _ in range(10):
        verdict, judgement = judge_verdict(history, "w", accepted)
        if judgement.newly_banned:
            break
    assert judgement.newly_banned and not verdict.accepted
    assert verdict.reason.startswith("near_ties: ") and "beyond the honest rate" in verdict.reason
    unprefilled = Verdict(b"s" * 32, False, (CheckResult("policy", False, "old"),))
    later, nothing = judge_verdict(history, "w", unprefilled)
    assert nothing is None and later.checks[-1].name == "near_ties" and not later.checks[-1].ok


def test_the_validator_bans_through_its_history_and_reports_once():
    from types import SimpleNamespace

    from swarm.roles.validator import NearTieHistories, VersionModels
    from verify.reputation import Reputation

    emitted = []
    node = SimpleNamespace(events=SimpleNamespace(emit=emitted.append))
    models = VersionModels(loaded=None)
    models.specs[1] = SimpleNamespace(precision="float32")
    workers = NearTieHistories(Reputation())
    group = SimpleNamespace(worker="cheat", policy_version=1)
    verdict = Verdict(b"r" * 32, True, (CheckResult("sampling", True, near_ties=record(256, 3)),))
    outcomes = [workers.judge([verdict], {verdict.rollout_id: group}, models, node)[0] for _ in range(8)]
    assert outcomes[0].accepted and not outcomes[-1].accepted and workers.is_banned("cheat")
    assert [e.kind for e in emitted] == ["worker_banned"] and emitted[0].worker == "cheat"
    assert not workers.is_banned("someone else")


@pytest.fixture(scope="module")
def ctx() -> RunContext:
    return RunContext(run="run-a", current_version=VERSION, async_window=2, manifest_ids=MANIFESTS, max_new_tokens=64,
                      dataset="basic_arithmetic", eligible=list(range(16)), prompts_per_step=2, eos_ids=(),
                      tasks=GymTasks(size=16), temperature=0.8, group_size=4)


@pytest.fixture(scope="module")
def model():
    return tiny_model(0)


def test_the_sampling_check_records_each_groups_near_ties(model, ctx):
    groups = [honest_group(model, ctx, worker=f"w{i}", step=i, version=VERSION, group_size=4, temperature=0.8)
              for i in range(2)]
    for group, verdict in zip(groups, verify_groups({VERSION: model}, groups, ctx, CheckConfig())):
        assert verdict.accepted
        assert near_ties_of(verdict) == NearTies(sum(len(c.tokens) for c in group.completions), 0,
                                                 NO_NEAR_TIES.gap_bins)


def steered(model, ctx, step: int):
    config = CheckConfig()
    return honest_group(model, ctx, worker="cheat", step=step, version=VERSION, group_size=4, temperature=0.8,
                        choose=attacks.NearTieSteerer(config.near_tie_tol, config.max_near_tie_fraction))


def int8_reproved(model, ctx, step: int):
    cheap = int8_reproved.cheap = getattr(int8_reproved, "cheap", None) or attacks.int8_model(model)
    group = honest_group(cheap, ctx, worker="cheat", step=step, version=VERSION, group_size=4, temperature=0.8)
    return attacks.reprove(model, group)


@pytest.mark.parametrize("attack", [steered, int8_reproved])
def test_a_worker_cheating_within_each_groups_near_tie_allowance_is_banned(model, ctx, attack):
    """The real generator with one thing changed: wherever the runner-up is within the near-tie tolerance it is
    taken (within the per-group allowance), or the tokens come from an int8 copy with proofs and logprobs rebuilt
    from the right model. Steered groups all pass the checks, int8 ones some of the time; the history bans both."""
    history = WorkerHistory(HistoryConfig.for_precision("float32"))
    banned_at, passed = None, 0
    for step in range(20):
        verdict = verify_groups({VERSION: model}, [attack(model, ctx, step)], ctx, CheckConfig())[0]
        passed += verdict.accepted
        verdict, judgement = judge_verdict(history, "cheat", verdict)
        if judgement.newly_banned:
            banned_at = step + 1
            assert not verdict.accepted and [c.name for c in verdict.checks if not c.ok][-1] == "near_ties"
            break
    assert banned_at is not None and banned_at <= 20
    if attack is steered:
        assert passed == banned_at  # every group passed the checks on its own, the banning one too
    _, total = history.totals("cheat")
    assert total.flips >= 3 and total.gap_bins[0] == 0  # not kernel noise: no flip within 1e-6


def test_votes_sum_a_workers_evidence_across_validators_it_spread_its_groups_over():
    """20 groups of a steerer spread over 20 validators: none of them sees enough to ban it alone, the votes'
    evidence summed across validators bans it; one lying validator among three cannot frame an honest worker."""
    from verify.worker_history import VoteEvidence

    config = HistoryConfig.for_precision("float32")
    validators = [bytes([v]) * 32 for v in range(20)]
    locals_ = {v: WorkerHistory(config) for v in validators}
    summed = VoteEvidence(config, replicas=3)
    banned_at = None
    for n in range(20):
        rollout, assigned = bytes([n]) * 32, [validators[(n + k) % 20] for k in range(3)]
        for v in assigned:
            verdict = Verdict(rollout, True, (CheckResult("sampling", True, near_ties=record(256, 1)),))
            vote_checks = [(c.name, c.ok, c.reason) for c in judge_verdict(locals_[v], "cheat", verdict)[0].checks]
            judgement = summed.on_vote("cheat", rollout, v, vote_checks)
        if judgement is not None and judgement.newly_banned and banned_at is None:
            banned_at = n + 1
    assert not any(h.is_banned("cheat") for h in locals_.values())  # 3 groups each: not enough alone
    assert banned_at is not None and banned_at <= 20
    honest = VoteEvidence(config, replicas=3)
    for n in range(50):
        rollout = bytes([n]) * 32
        honest.on_vote("w", rollout, validators[0], [("near_ties", True, "40/256")])  # the liar
        honest.on_vote("w", rollout, validators[1], [("near_ties", True, "0/256")])
        honest.on_vote("w", rollout, validators[2], [("near_ties", True, "0/256")])
    assert not honest.history.is_banned("w") and honest.history.totals("w")[1].flips == 0
    assert honest.on_vote("w", b"x" * 32, validators[0], [("sampling", True, "")]) is None
    row = [("near_ties", True, "0/9")]
    assert honest.on_vote("w", b"y" * 32, validators[0], row) is None
    assert honest.on_vote("w", b"y" * 32, validators[0], row) is None  # one validator counts once
    assert honest.on_vote("other", b"y" * 32, validators[1], row) is None  # not the rollout's worker
    assert honest.on_vote("w", b"y" * 32, validators[2], row) is None  # two distinct validators of three
    assert honest.history.totals("w")[0] == 50 and honest.history.totals("other")[0] == 0
