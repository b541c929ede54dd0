"""The gate's judgements survive a trainer restart: they travel in the checkpoint's state, bounded, and a malformed
state refuses the resume instead of judging every worker afresh."""

from __future__ import annotations

import copy
import json
import random

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from swarm.bench.fuzz_mutations import edit_tree
from swarm.roles.gate_probation import ProbationConfig
from tests.swarm.test_swarm_gate_near_ties import TOKENS, gate_with, group, panel, send
from trainer.checkpoint import TrainerState, latest_checkpoint, load_checkpoint, save_checkpoint
from trainer.errors import TrainerError


def judged_gate(validators):
    """A gate that banned a steering worker by its near-ties and a validator by its votes, and proved a worker."""
    gate = gate_with(validators, replicas=2)
    for task in range(ProbationConfig().graduate_after):
        send(gate, validators, group("honest", task), 0)
    for task in range(100, 140):
        send(gate, validators, group("steer", task), TOKENS)
        if gate.is_banned("steer"):
            break
    for _ in range(4):
        gate.reputation.record(next(iter(validators)), False)
    return gate


def restarted(gate, validators, tmp_path):
    """The gate's snapshot through a real checkpoint on disk, into the gate of a fresh trainer process."""
    model = torch.nn.Linear(2, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0)
    save_checkpoint(tmp_path, model, optimizer, scheduler, TrainerState(step=3, extra={"gate": gate.snapshot()}))
    state = load_checkpoint(latest_checkpoint(tmp_path), model, optimizer, scheduler)
    fresh = gate_with(validators, replicas=2)
    fresh.restore(state.extra.get("gate"))
    return fresh


@pytest.fixture(scope="module")
def judged():
    validators = panel(6)
    return validators, judged_gate(validators)


def test_a_restarted_trainer_keeps_its_bans_and_each_workers_record(judged, tmp_path):
    validators, before = judged
    gate = restarted(before, validators, tmp_path)
    liar = next(iter(validators))
    assert gate.evidence.is_banned("steer") and gate.on_rollout(group("steer", 999), 1.0) == "near_ties"
    assert gate.probation.is_proven("honest") and not gate.is_banned("honest")
    assert gate.validator_banned(liar) and not gate.validator_banned(list(validators)[1])
    assert gate.evidence.export() == before.evidence.export()
    assert gate.reputation.export() == before.reputation.export()
    assert gate.probation.export() == before.probation.export()


def test_a_checkpoint_without_a_gate_state_leaves_the_gate_fresh():
    gate = gate_with(panel(3), replicas=2)
    gate.restore(None)
    assert gate.snapshot()["histories"] == {} and gate.probation.size() == 0


MALFORMED = [
    lambda s: s.update(format=2),
    lambda s: s["histories"].update(float64={"records": [], "banned": []}),
    lambda s: s["histories"]["float32"]["records"].append(["w", 1, 10, 11]),  # more flips than tokens
    lambda s: s["histories"]["float32"]["records"].append(["w", -1, 10, 1]),
    lambda s: s["histories"]["float32"]["records"].append(["w" * 500, 1, 10, 1]),
    lambda s: s["histories"]["float32"]["banned"].append(["w", 7]),
    lambda s: s["reputation"]["scores"].append(["worker", "w", float("nan")]),
    lambda s: s["reputation"]["scores"].append(["validator", "zz", 1.0]),
    lambda s: s["reputation"]["banned"].append(["root", "w"]),
    lambda s: s["probation"]["unproven"].append(["w", "8"]),
    lambda s: s["probation"].update(proven=["w"] * 20_001),
    lambda s: s.pop("probation"),
]


@pytest.mark.parametrize("mutate", range(len(MALFORMED)))
def test_a_malformed_gate_state_refuses_the_resume_and_changes_nothing(judged, mutate):
    validators, before = judged
    bad = copy.deepcopy(before.snapshot())
    MALFORMED[mutate](bad)
    gate = gate_with(validators, replicas=2)
    with pytest.raises(TrainerError, match="gate state in the checkpoint is malformed"):
        gate.restore(json.loads(json.dumps(bad)))
    assert gate.probation.size() == 0 and gate.evidence.export() == {}


def test_the_state_stays_bounded_however_many_identities_the_run_saw():
    validators = panel(3)
    gate = gate_with(validators, replicas=2)
    for table in (gate.reputation, gate.probation):
        table.config = type(table.config)(**{**table.config.__dict__, **(
            {"max_peers": 50} if hasattr(table.config, "max_peers") else {"max_workers": 50})})
    liar = next(iter(validators))
    for _ in range(4):
        gate.reputation.record(liar, False)
    for i in range(400):  # each identity banned for its rejected groups, and one accepted
        for _ in range(4):
            gate.reputation.record(f"w{i}", False)
        gate.probation.on_accepted(f"w{i}")
    snap = gate.snapshot()
    assert len(snap["reputation"]["scores"]) <= 50 and len(snap["probation"]["unproven"]) <= 50
    assert len(snap["reputation"]["banned"]) <= 50 and gate.validator_banned(liar)  # workers evict only workers
    assert len(json.dumps(snap)) < 50 * 3 * 100


@settings(max_examples=200, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.randoms(use_true_random=False))
def test_any_edit_of_a_gate_state_restores_or_refuses_in_one_sentence(judged, rng: random.Random):
    """The state comes from disk: whatever it holds, restoring it either succeeds or refuses the resume with a
    TrainerError, and a refused state changes nothing."""
    validators, before = judged
    tree = copy.deepcopy(before.snapshot())
    for _ in range(rng.choice((1, 1, 2, 3))):
        tree = edit_tree(tree, rng)
    gate = gate_with(validators, replicas=2)
    try:
        gate.restore(tree)
    except TrainerError:
        assert gate.probation.size() == 0 and gate.evidence.export() == {}


def test_the_judgements_go_into_the_trainer_state_only_when_a_checkpoint_is_due(judged):
    _, gate = judged
    extra = {"tokens": 5}
    gate.keep_in(extra, due=False)
    assert extra == {"tokens": 5}
    gate.keep_in(extra, due=True)
    assert extra["gate"] == gate.snapshot() and json.loads(json.dumps(extra))["gate"] == extra["gate"]
