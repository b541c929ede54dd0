"""One lying validator changes nothing the trainer trains: with three or more rows per group the median holds, and
where the only two rows disagree beyond honest kernel noise the group is disputed and not trained."""

from __future__ import annotations

import random

from swarm.roles.gate_evidence import combine_rows, tolerance
from tests.swarm.test_swarm_gate_near_ties import STEERING_RATE, TOKENS, flips_at, gate_with, group, panel, send


def test_three_or_more_rows_take_the_median_so_one_row_can_neither_lower_nor_raise_it():
    assert combine_rows([(0, 256), (3, 256), (3, 256)], 0) == ((3, 256), False)
    assert combine_rows([(256, 256), (0, 256), (0, 256)], 0) == ((0, 256), False)
    assert combine_rows([(0, 256), (2, 256), (3, 256), (3, 256)], 0) == ((2, 256), False)
    assert combine_rows([(9, 256), (2, 256), (2, 256), (2, 256), (0, 256)], 0) == ((2, 256), False)


def test_two_rows_that_agree_within_the_tolerance_give_the_lower_and_are_not_disputed():
    assert combine_rows([(3, 256), (3, 256)], 0) == ((3, 256), False)
    assert combine_rows([(4, 256), (7, 256)], 5) == ((4, 256), False)


def test_two_rows_that_disagree_are_disputed_and_the_lower_one_enters_the_history():
    """The lower: a liar claiming flips cannot frame an honest worker; disputed: a liar claiming none cannot get the
    group trained."""
    assert combine_rows([(0, 256), (3, 256)], 0) == ((0, 256), True)
    assert combine_rows([(256, 256), (0, 256)], 0) == ((0, 256), True)
    assert combine_rows([(0, 256), (0, 200)], 0) == ((0, 200), True)  # every validator re-derives every token
    assert combine_rows([(0, 256), (6, 256)], 5)[1] is True


def test_one_row_is_the_whole_judgement_of_a_single_replica_run_and_none_otherwise():
    assert combine_rows([(1, 256)], 0, replicas=1) == ((1, 256), False)
    assert combine_rows([(1, 256)], 0, replicas=2) == (None, False)
    assert combine_rows([], 0, replicas=2) == (None, False)


def test_the_tolerance_is_the_honest_flips_of_the_precision():
    assert tolerance("float32", 256) == 0 and tolerance("float32", 20_000) == 2
    assert tolerance("bfloat16", 256) == 5


def test_with_six_validators_and_two_replicas_a_liar_hiding_flips_gets_no_steered_group_trained():
    from verify.votes import assign_validators

    validators, rng = panel(6), random.Random(5)
    liar = next(iter(validators))
    gate = gate_with(validators, replicas=2)
    lied_for, trained = set(), []
    for task in range(60):  # each identity once: no history is long enough to ban it
        g, flips = group(f"steer-{task}", task), flips_at(STEERING_RATE, rng)
        if flips and liar in assign_validators(g.slot().key(), list(validators), 2):
            lied_for.add(g.worker)
        send(gate, validators, g, flips, liar=liar, lie=0)
        trained += [b.worker for b in gate.take(8)]
    assert len(lied_for) >= 5 and not lied_for & set(trained), (lied_for, trained)
    assert gate.counts["refused:disputed"] == len(lied_for)


def test_a_liar_claiming_flips_in_honest_groups_only_disputes_them_and_bans_nobody():
    validators = panel(6)
    liar = next(iter(validators))
    gate = gate_with(validators, replicas=2)
    for task in range(200):
        send(gate, validators, group("honest", task), 0, liar=liar, lie=TOKENS)
    assert not gate.is_banned("honest")
    assert len(gate.accepted) + gate.counts["refused:disputed"] == 200 and gate.counts["refused:disputed"] > 30


def test_a_liar_that_leaves_out_its_evidence_row_disputes_the_group_as_one_that_reports_none():
    """An accepting vote without exactly one evidence row, beside one that carries a row, is no way around the
    dispute: the liar's silence is as good as its zero."""
    from tests.swarm.test_swarm_gate_near_ties import evidence_vote
    from verify.checks import CheckResult
    from verify.votes import assign_validators, sign_vote

    validators = panel(2)
    gate = gate_with(validators, replicas=2)
    liar, honest = list(validators)
    for task, checks in enumerate(([CheckResult("sampling", True, "")],
                                   [CheckResult("near_ties", True, "0/256"), CheckResult("near_ties", True, "0/256")])):
        g = group(f"steer-{task}", task)
        assert set(assign_validators(g.slot().key(), list(validators), 2)) == {liar, honest}
        gate.on_rollout(g, 0.0)
        gate.on_vote(sign_vote(validators[liar], g.rollout_id(), True, checks), 0.0)
        gate.on_vote(evidence_vote(validators[honest], g, 3), 0.0)
    assert gate.take(8) == [] and gate.counts["refused:disputed"] == 2


def test_votes_that_carry_no_evidence_at_all_dispute_nothing():
    from verify.checks import CheckResult
    from verify.votes import sign_vote

    validators = panel(2)
    gate = gate_with(validators, replicas=2)
    g = group("w", 1)
    gate.on_rollout(g, 0.0)
    for private in validators.values():
        gate.on_vote(sign_vote(private, g.rollout_id(), True, [CheckResult("reward", True, "")]), 0.0)
    assert gate.take(8) == [g]
