"""A worker's groups for one version fill at most the spec's prompts per worker distinct slots at the gate: an honest
worker answers exactly its assigned prompts, so a group for a slot past them is refused, costs its worker and is
kept nowhere (identities are free, so anything else lets one identity hold the trainer's memory and the validators'
work without bound)."""

from __future__ import annotations

from swarm.roles.gate import SLOTS_FULL
from tests.swarm.test_swarm_gate import gate_with, group, keys


def test_a_flood_of_made_up_tasks_opens_only_the_assigned_count():
    gate = gate_with(keys(3))
    ppw = gate.specs[1].prompts_per_worker
    outcomes = [gate.on_rollout(group(worker="w1", task=i), 0.0) for i in range(10_000)]
    assert outcomes[:ppw] == ["opened"] * ppw
    assert set(outcomes[ppw:]) <= {SLOTS_FULL, "worker banned"} and SLOTS_FULL in outcomes
    assert len(gate.pending) == ppw and len(gate.slots) == ppw
    assert len(gate.answers[1]["w1"]) == ppw
    assert gate.is_banned("w1")  # each refusal costs its worker, as a rejected rollout does


def test_the_cap_is_per_worker_and_per_version():
    gate = gate_with(keys(3))
    ppw = gate.specs[1].prompts_per_worker
    for worker in ("w1", "w2"):
        for version in (0, 1):
            assert [gate.on_rollout(group(version, worker=worker, task=t), 0.0) for t in range(ppw)] == \
                ["opened"] * ppw
    assert gate.on_rollout(group(1, worker="w1", task=ppw), 0.0) == SLOTS_FULL
    assert gate.counts[f"refused:{SLOTS_FULL}"] == 1
    assert len(gate.pending) == 4 * ppw and not gate.is_banned("w2")


def test_an_answered_slot_again_is_still_an_echo_or_a_resubmission():
    gate = gate_with(keys(3))
    ppw = gate.specs[1].prompts_per_worker
    groups = [group(worker="w1", task=t) for t in range(ppw)]
    assert [gate.on_rollout(g, 0.0) for g in groups] == ["opened"] * ppw
    assert gate.on_rollout(groups[0], 1.0) == "duplicate"
    assert gate.on_rollout(group(worker="w1", task=0), 1.0) == "another group for an answered slot"


def test_refused_groups_of_a_banned_worker_fill_no_more_than_its_slots():
    gate = gate_with(keys(3))
    gate.reputation.record("w1", False)
    while not gate.is_banned("w1"):
        gate.reputation.record("w1", False)
    for i in range(1000):
        assert gate.on_rollout(group(worker="w1", task=i), 0.0) == "worker banned"
    assert len(gate.answers[1]["w1"]) <= gate.specs[1].prompts_per_worker and not gate.pending


def test_answered_in_full_still_counts_the_assigned_slots():
    gate = gate_with(keys(3))
    ppw = gate.specs[1].prompts_per_worker
    for t in range(ppw - 1):
        gate.on_rollout(group(worker="w1", task=t), 0.0)
    assert not gate.answered_in_full(1, {"w1"})
    gate.on_rollout(group(worker="w1", task=ppw - 1), 0.0)
    assert gate.answered_in_full(1, {"w1"})
    assert gate.on_rollout(group(worker="w1", task=ppw), 0.0) == SLOTS_FULL
    assert gate.answered_in_full(1, {"w1"}) == (not gate.is_banned("w1"))


def test_slots_answered_in_time_count_against_the_late_ones_judged():
    gate = gate_with(keys(3))
    ppw = gate.specs[1].prompts_per_worker
    assert [gate.on_rollout(group(worker="w1", task=t), 0.0) for t in range(ppw)] == ["opened"] * ppw
    gate.specs[3], gate.newest = gate.specs[1], 3  # v1 is now behind the async window, still judged
    assert gate.on_rollout(group(worker="w1", task=ppw), 1.0) == "too stale"
    assert len(gate.pending) == ppw and not gate.judged_only  # refused unjudged: its slots were all answered
