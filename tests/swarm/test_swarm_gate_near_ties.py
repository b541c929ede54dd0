"""The trainer's gate sums each worker's near-tie evidence over the groups it settles and bans a steering worker,
however many validators its groups are spread over; honest workers and one lying validator never cause a ban."""

from __future__ import annotations

import dataclasses
import os
import random

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from swarm.policy.runspec import RunSpec
from swarm.roles.gate import RolloutGate
from verify.checks import CheckResult
from verify.neartie import NO_NEAR_TIES, NearTies
from verify.rollout import Completion, RolloutGroup
from verify.votes import assign_validators, public_key_of, sign_vote
from verify.worker_history import evidence_row

TOKENS = 256  # 4 completions x 64 tokens, as `swarm bench verify` measures
STEERING_RATE = 5 / 723  # near_ties_steered in `swarm bench verify --history only`: 5 flips in 723 tokens
HONEST_FP32_RATE = 6.6e-6  # the 95 % upper bound of 0 flips in 453,188 honest float32 tokens
HONEST_BF16_RATE = 0.00739  # honest bfloat16 workers: 0.739 % of their tokens
PROMPTS_PER_WORKER = 2048  # more than any worker here sends for the one version (the gate refuses groups past it)


def panel(n) -> dict[bytes, bytes]:
    """n validators: public key -> private key (deriving public keys per vote would dominate the tests' time)."""
    private = [Ed25519PrivateKey.generate().private_bytes_raw() for _ in range(n)]
    return {public_key_of(k): k for k in private}


def gate_with(validators, precision="float32", replicas=3) -> RolloutGate:
    spec = RunSpec("basic_arithmetic", 100_000, "{}", 0, 0.2, "all", PROMPTS_PER_WORKER, 2, 2, 2,
                   tuple(key.hex() for key in validators))
    gate = RolloutGate("run", replicas=replicas, quorum=2, timeout_s=10.0, async_level=1)
    gate.specs[1] = dataclasses.replace(spec, precision=precision)
    gate.newest = 1
    return gate


def group(worker: str, task: int) -> RolloutGroup:
    completion = Completion((5, 6, 7), (-0.1, -0.2, -0.3), "eos", 1.0, b"\x00" * 4)
    return RolloutGroup("run", 1, os.urandom(32), worker, 1, "basic_arithmetic", task, (1, 2), 0.6, 16,
                        (completion, completion))


def evidence_vote(key, g, flips: int):
    row = CheckResult(*evidence_row(NearTies(TOKENS, flips, NO_NEAR_TIES.gap_bins)))
    return sign_vote(key, g.rollout_id(), True, [CheckResult("sampling", True, ""), row])


def flips_at(rate: float, rng: random.Random) -> int:
    """One group's flips when each of its tokens flips independently with probability `rate`."""
    return sum(rng.random() < rate for _ in range(TOKENS))


def send(gate, validators, g, flips: int, liar=None, lie: int = TOKENS) -> None:
    """One group through the gate; its assigned validators vote it in with the group's flips (the liar with `lie`)."""
    assert gate.on_rollout(g, 0.0) in ("opened", "near_ties")
    for key in assign_validators(g.slot().key(), list(validators), gate.replicas):
        gate.on_vote(evidence_vote(validators[key], g, lie if key == liar else flips), 0.0)


@pytest.mark.parametrize("replicas", [2, 3])  # the default 2 of 2, and 2 of 3
def test_a_steering_worker_spread_over_many_validators_is_banned_by_the_trainer_within_20_of_its_groups(replicas):
    validators, rng = panel(12), random.Random(7)
    gate = gate_with(validators, replicas=replicas)
    banned_after = []
    for w in range(20):
        worker = f"steer{w}"
        for task in range(40):
            send(gate, validators, group(worker, task), flips_at(STEERING_RATE, rng))
            if gate.evidence.is_banned(worker):
                banned_after.append(task + 1)
                break
    assert len(banned_after) == 20 and max(banned_after) <= 20, banned_after
    bans = gate.take_new_bans()
    assert sorted(w for w, _ in bans) == sorted(f"steer{w}" for w in range(20)) and gate.take_new_bans() == []
    assert all("are not the seeded sample" in reason for _, reason in bans)
    assert not any(g.worker.startswith("steer") for g in gate.accepted)  # its accepted groups are refused
    assert gate.counts["refused:near_ties"] >= 20
    assert gate.on_rollout(group("steer0", 99), 1.0) == "near_ties"


def test_honest_workers_at_the_measured_rates_are_never_banned():
    for precision, rate in (("float32", HONEST_FP32_RATE), ("bfloat16", HONEST_BF16_RATE)):
        validators, rng = panel(12), random.Random(11)
        gate = gate_with(validators, precision)
        for task in range(1000):
            send(gate, validators, group(f"honest{task % 10}", task), flips_at(rate, rng))
        assert gate.take_new_bans() == [] and len(gate.accepted) == 1000, precision


@pytest.mark.parametrize("replicas", [2, 3])
def test_one_lying_validator_cannot_get_an_honest_worker_banned(replicas):
    validators = panel(12)
    gate = gate_with(validators, replicas=replicas)
    for task in range(300):  # the liar sits in a sixth or a quarter of the groups, claiming every token flipped
        send(gate, validators, group("honest", task), 0, liar=next(iter(validators)))
    assert not gate.is_banned("honest")  # the groups it settles with one other row are disputed, not trained
    assert len(gate.accepted) + gate.counts.get("refused:disputed", 0) == 300 and len(gate.accepted) > 200


def test_a_steering_worker_is_still_banned_when_one_validator_lies_for_it():
    """With three replicas the liar claiming no flips cannot hide them: the median of each group's votes still
    carries an honest validator's count (with two, the lower median is the liar's: see docs/security.md)."""
    validators, rng = panel(12), random.Random(3)
    gate = gate_with(validators)
    for task in range(40):
        send(gate, validators, group("steer", task), flips_at(STEERING_RATE, rng), liar=next(iter(validators)), lie=0)
        if gate.is_banned("steer"):
            break
    assert gate.is_banned("steer") and task < 40


def test_a_vote_by_a_key_that_is_not_assigned_or_not_signed_adds_no_evidence():
    validators, outsider = panel(3), next(iter(panel(1).values()))
    gate = gate_with(validators)
    for task in range(50):
        g = group("honest", task)
        for private in validators.values():  # forged votes before the real ones: their rows must not be kept
            gate.on_vote(dataclasses.replace(evidence_vote(private, g, TOKENS), signature=b"\x00" * 64), 0.0)
        gate.on_vote(evidence_vote(outsider, g, TOKENS), 0.0)
        send(gate, validators, g, 0)
    assert not gate.is_banned("honest") and len(gate.accepted) == 50
