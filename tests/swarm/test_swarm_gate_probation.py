"""Fresh identities buy no unbounded share of training: an unproven worker's groups are validated and count toward
its record, but beside proven workers they fill at most a bounded share of a batch, however many identities share it;
a banned validator's votes no longer count and it leaves the next version's validators."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

from swarm.roles.gate_probation import ProbationConfig
from tests.swarm.test_swarm_gate_near_ties import gate_with, group, panel, send

GRADUATE = ProbationConfig().graduate_after


def prove(gate, validators, worker: str, first_task: int = 1000) -> None:
    """`worker` sends as many accepted groups as graduation takes; the batches that held them are trained."""
    for task in range(first_task, first_task + GRADUATE):
        send(gate, validators, group(worker, task), 0)
    gate.take(10 * GRADUATE)
    assert gate.probation.is_proven(worker)


def test_a_crowd_of_fresh_identities_fills_no_more_than_the_unproven_share_however_many_it_is():
    for identities in (1, 10, 100):
        validators = panel(6)
        gate = gate_with(validators, replicas=2)
        prove(gate, validators, "honest")
        for i in range(identities):  # the crowd answers first: the trainer takes the freshest, first come first
            for task in range(2):
                send(gate, validators, group(f"fresh-{i}", task), 0)
        for task in range(4):
            send(gate, validators, group("honest", task), 0)
        batch = gate.take(10)
        fresh = sum(g.worker.startswith("fresh") for g in batch)
        assert fresh == 1 and len(batch) == 5, (identities, fresh, len(batch))  # 20 % of the batch at most
        assert all(g.worker.startswith("fresh") for g in gate.accepted)  # the rest waits, validated, untrained


def test_the_ready_count_is_what_a_batch_may_take():
    validators = panel(6)
    gate = gate_with(validators, replicas=2)
    prove(gate, validators, "honest")
    for i in range(50):
        send(gate, validators, group(f"fresh-{i}", 0), 0)
    for task in range(4):
        send(gate, validators, group("honest", task), 0)
    assert gate.expire() == 4 + 1 and len(gate.take(8)) == 5


def test_without_a_proven_worker_the_whole_batch_may_come_from_unproven_workers_longest_records_first():
    """A run's first versions have no proven worker: its fresh honest workers must still be trained (the
    simulation's two workers), and the workers with the longest records go first, so one-shot identities lose."""
    validators = panel(6)
    gate = gate_with(validators, replicas=2)
    for task in range(3):
        send(gate, validators, group("early", task), 0)
    gate.take(3)
    for i in range(20):
        send(gate, validators, group(f"one-shot-{i}", 0), 0)
    for task in range(3, 7):  # 7 accepted groups: still unproven
        send(gate, validators, group("early", task), 0)
    batch = gate.take(8)
    assert len(batch) == 8 and sum(g.worker == "early" for g in batch) == 4


def test_a_fresh_honest_worker_graduates_after_its_accepted_groups_and_is_then_trained_in_full():
    validators = panel(6)
    gate = gate_with(validators, replicas=2)
    prove(gate, validators, "veteran")
    for task in range(GRADUATE):  # validated while unproven: its record grows whether or not it is trained
        send(gate, validators, group("newcomer", task), 0)
        assert gate.probation.is_proven("newcomer") == (task + 1 >= GRADUATE)
    gate.take(100)
    for task in range(100, 104):
        send(gate, validators, group("newcomer", task), 0)
        send(gate, validators, group("veteran", task), 0)
    assert sorted(g.worker for g in gate.take(8)) == ["newcomer"] * 4 + ["veteran"] * 4


def test_a_banned_worker_loses_its_record_and_starts_unproven_under_a_new_name_only():
    validators = panel(6)
    gate = gate_with(validators, replicas=2)
    prove(gate, validators, "turncoat")
    for task in range(40):  # every token flipped: banned at once
        send(gate, validators, group("turncoat", task), 256)
        if gate.is_banned("turncoat"):
            break
    assert gate.is_banned("turncoat") and not gate.probation.is_proven("turncoat")


def test_records_are_bounded_node_wide_and_a_crowd_cannot_evict_proven_workers():
    validators = panel(6)
    gate = gate_with(validators, replicas=2)
    gate.probation.config = ProbationConfig(max_workers=50)
    prove(gate, validators, "honest")
    for i in range(500):  # each identity one accepted group, then gone
        send(gate, validators, group(f"fresh-{i}", 0), 0)
    gate.take(1000)
    assert gate.probation.is_proven("honest") and gate.probation.size() <= 50 + 1


def test_a_banned_validators_votes_no_longer_count():
    validators = panel(3)
    gate = gate_with(validators, replicas=2)
    liar = next(iter(validators))
    for _ in range(4):  # four votes against the settled outcome ban it (verify/reputation.py)
        gate.reputation.record(liar, False)
    assert gate.validator_banned(liar)
    g = group("w", 1)
    gate.on_rollout(g, 0.0)
    from tests.swarm.test_swarm_gate_near_ties import evidence_vote

    assert gate.on_vote(evidence_vote(validators[liar], g, 0), 0.0) == "validator banned"
    assert gate.counts["vote:validator banned"] == 1


def test_a_banned_validator_leaves_the_next_versions_validators(tmp_path):
    from p2p.identity import peer_id_from_public_bytes
    from swarm.roles.trainer import SwarmPublisher
    from tests.swarm.test_swarm_gate import trainer_context

    validators = panel(3)
    gate = gate_with(validators, replicas=2)
    node = trainer_context(tmp_path, (), peer_roles={peer_id_from_public_bytes(k): ("validator",) for k in validators},
                           events=SimpleNamespace(emit=lambda event: None))
    publisher = SwarmPublisher(node, cfg=None)
    publisher.excluded = gate.validator_banned
    liar = next(iter(validators))
    assert liar.hex() in publisher.known_validators()
    for _ in range(4):
        gate.reputation.record(liar, False)
    assert sorted(publisher.known_validators()) == sorted(k.hex() for k in validators if k != liar)


def test_a_crowd_first_to_answer_a_new_version_takes_no_batch_before_the_proven_workers_answer_it():
    """Synchronous runs (async level 0) judge only the newest version: right after it goes out no proven worker
    has answered it yet, which must not read as a run with no proven worker."""
    validators = panel(6)
    gate = gate_with(validators, replicas=2)
    gate.async_level = 0
    prove(gate, validators, "honest")
    gate.specs[2], gate.newest = gate.specs[1], 2
    for i in range(20):
        send(gate, validators, dataclasses.replace(group(f"fresh-{i}", 0), policy_version=2, step=2), 0)
    assert gate.expire() == 0 and gate.take(8) == []
