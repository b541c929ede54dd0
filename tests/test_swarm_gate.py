"""The trainer's rollout gate: only rollouts a quorum of the version's validators accepted reach training."""

from __future__ import annotations

import os

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from swarm.role_trainer import RolloutGate
from swarm.runspec import RunSpec
from verify.checks import CheckResult
from verify.rollout import Completion, RolloutGroup
from verify.votes import assign_validators, public_key_of, sign_vote


def keys(n):
    return [Ed25519PrivateKey.generate().private_bytes_raw() for _ in range(n)]


def spec(validators) -> RunSpec:
    return RunSpec("basic_arithmetic", 64, "{}", 0, 0.2, "all", 2, 2, 2, 2,
                   tuple(public_key_of(k).hex() for k in validators))


def group(version=1, step=None, worker="w1", task=3, reward=1.0) -> RolloutGroup:
    completion = Completion((5, 6, 7), (-0.1, -0.2, -0.3), "eos", reward, b"\x00" * 4)
    return RolloutGroup("run", version, os.urandom(32), worker, version if step is None else step, "basic_arithmetic",
                        task, (1, 2), 0.6, 16, (completion, completion))


def gate_with(validators, newest=1) -> RolloutGate:
    gate = RolloutGate("run", replicas=2, quorum=2, timeout_s=10.0, async_level=1)
    for v in range(newest + 1):
        gate.specs[v] = spec(validators)
    gate.newest = newest
    return gate


def vote(key, g, accept=True):
    return sign_vote(key, g.rollout_id(), accept, [CheckResult("reward", accept, "" if accept else "fabricated")])


def assigned(keys_, g):
    chosen = assign_validators(g.rollout_id(), [public_key_of(k) for k in keys_], 2)
    return [k for k in keys_ if public_key_of(k) in chosen]


def test_quorum_of_assigned_validators_releases_the_group():
    validators = keys(3)
    gate = gate_with(validators)
    g = group()
    assert gate.on_rollout(g, now=0.0) == "opened"
    first, second = assigned(validators, g)
    assert gate.on_vote(vote(first, g), 1.0) == "counted" and gate.accepted == []
    assert gate.on_vote(vote(second, g), 1.5) == "counted"
    assert gate.take(8) == [g] and gate.accepted == []


def test_unassigned_forged_and_rejecting_votes_never_release():
    validators = keys(4)
    gate = gate_with(validators)
    g = group()
    gate.on_rollout(g, 0.0)
    outsider = [k for k in validators if k not in assigned(validators, g)][0]
    assert gate.on_vote(vote(outsider, g), 1.0) == "unassigned"
    forged = vote(assigned(validators, g)[0], g)
    forged = type(forged)(forged.rollout_id, forged.validator, forged.accept, forged.checks, bytes(64))
    assert gate.on_vote(forged, 1.0) == "forged"
    assert gate.on_vote(vote(assigned(validators, g)[0], g, accept=False), 2.0) == "counted"
    assert gate.accepted == [] and gate.counts.get("rejected") == 1


def test_stale_wrong_step_duplicate_and_unknown_versions_are_refused():
    validators = keys(2)
    gate = gate_with(validators, newest=3)
    assert gate.on_rollout(group(version=1), 0.0) == "too stale"  # async level 1: v2 and v3 only
    assert gate.on_rollout(group(version=9), 0.0) == "unknown policy version"
    assert gate.on_rollout(group(version=3, step=2), 0.0) == "assignment step differs from the policy version"
    g = group(version=3)
    assert gate.on_rollout(g, 0.0) == "opened"
    assert gate.on_rollout(g, 0.0) == "duplicate"


def test_unvoted_rollouts_time_out_and_rejected_workers_get_banned():
    validators = keys(2)
    gate = gate_with(validators)
    lonely = group(worker="slow")
    gate.on_rollout(lonely, 0.0)
    gate.tick(11.0)
    assert gate.counts.get("timed_out") == 1 and gate.accepted == []
    for task in range(20):
        g = group(worker="cheat", task=task)
        if gate.on_rollout(g, 20.0 + task) != "opened":
            break
        for k in validators:
            gate.on_vote(vote(k, g, accept=False), 20.5 + task)
    assert gate.reputation.is_banned("cheat")
    assert gate.on_rollout(group(worker="cheat", task=99), 50.0) == "worker banned"
