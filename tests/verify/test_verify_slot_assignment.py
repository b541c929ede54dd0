"""Which validators check a rollout: drawn from its slot and the run's validator set, never from its bytes."""

from __future__ import annotations

import os

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from swarm.policy.runspec import RunSpec
from swarm.roles.gate import RolloutGate
from verify.rollout import Completion, RolloutGroup
from verify.votes import assign_validators, public_key_of


def keys(n):
    return [Ed25519PrivateKey.generate().private_bytes_raw() for _ in range(n)]


def spec(validators) -> RunSpec:
    return RunSpec("basic_arithmetic", 64, "{}", 0, 0.2, "all", 2, 2, 2, 2,
                   tuple(public_key_of(k).hex() for k in validators))


def group(version=1, worker="w1", task=3, reward=1.0) -> RolloutGroup:
    """A group of slot (run, version, worker, step = version, task); its manifest id makes its bytes unique."""
    completion = Completion((5, 6, 7), (-0.1, -0.2, -0.3), "eos", reward, b"\x00" * 4)
    return RolloutGroup("run", version, os.urandom(32), worker, version, "basic_arithmetic", task, (1, 2), 0.6, 16,
                        (completion, completion))


def gate_with(validators) -> RolloutGate:
    gate = RolloutGate("run", replicas=2, quorum=2, timeout_s=10.0, async_level=1)
    gate.specs[1], gate.newest = spec(validators), 1
    return gate


def assigned(keys_, g):
    chosen = assign_validators(g.slot().key(), [public_key_of(k) for k in keys_], 2)
    return [k for k in keys_ if public_key_of(k) in chosen]


def announced(g: RolloutGroup):
    """The announcement a worker makes for `g` when it is too large for gossip (swarm.messages.rollout_codec)."""
    from swarm.messages.rollout_codec import Announcement

    return Announcement(b"b" * 32, 10, 20, g.worker, g.rollout_id(), g.policy_version, (), g.run, g.step, g.dataset,
                        g.task_index)


def test_the_validators_of_a_rollout_follow_its_slot_never_its_bytes():
    """A worker that jitters its group's bytes until colluding validators are drawn draws the same ones every time:
    the gate's quorum, a validator's filter for inline groups and for announced ones all key on the slot."""
    from swarm.roles.validator import assigned_to_me
    from verify.quorum import QuorumConfig, QuorumTracker

    validators = keys(6)
    version, pubs = spec(validators), [public_key_of(k) for k in validators]
    tracker = QuorumTracker(QuorumConfig(replicas=2, quorum=2))
    ground = [group(reward=i / 200) for i in range(200)]  # one slot, 200 byte variants (manifest id, rewards)
    assert len({g.rollout_id() for g in ground}) == 200
    drawn = {tracker.open(g.rollout_id(), g.slot().key(), version.validators_for(g.worker), 0.0)[0] for g in ground}
    assert len(drawn) == 1
    for key in pubs:
        mine = {assigned_to_me(g.slot().key(), g.worker, version, key) for g in ground}
        assert mine == {key in next(iter(drawn))}  # all or none of the variants, inline or announced alike
        assert {assigned_to_me(announced(g).slot().key(), g.worker, version, key) for g in ground} == mine
    spread = {assign_validators(group(task=t).slot().key(), pubs, 2) for t in range(40)}
    assert len(spread) > 5  # other slots do draw other validators: the assignment is not constant


def test_the_gate_draws_for_a_group_the_validators_of_its_slot():
    validators = keys(5)
    gate = gate_with(validators)
    first, second = group(), group()
    assert first.slot() == second.slot() and first.rollout_id() != second.rollout_id()
    assert gate.on_rollout(first, 0.0) == "opened"
    assert set(gate.tracker.assigned(first.rollout_id())) == {public_key_of(k) for k in assigned(validators, second)}


def test_a_validator_fetches_only_announced_groups_assigned_to_it_and_not_from_workers_it_banned():
    from types import SimpleNamespace

    from swarm.roles.validator import VersionModels, assigned_to_me, wants_announced
    from verify.reputation import Reputation

    keys = [bytes([k]) * 32 for k in range(1, 6)]
    spec = SimpleNamespace(validators_for=lambda worker: keys, replicas=2)
    models = VersionModels(loaded=None)
    models.specs[3] = spec
    workers = Reputation()
    wanted = wants_announced(models, workers, keys[0])
    anns = [announced(group(version=3, worker="w", task=i)) for i in range(40)]
    mine = [a for a in anns if assigned_to_me(a.slot().key(), a.worker, spec, keys[0])]
    assert 0 < len(mine) < len(anns)  # rendezvous hashing spreads 40 groups over 5 validators, 2 each
    assert [a for a in anns if wanted(a)] == mine
    unknown_version = SimpleNamespace(worker="w", policy_version=4, rollout_id=bytes(32))
    assert wanted(unknown_version)  # its validator set is not known yet: fetch, decide after download
    for _ in range(4):
        workers.record("w", good=False)
    assert workers.is_banned("w") and not any(wanted(a) for a in anns + [unknown_version])

