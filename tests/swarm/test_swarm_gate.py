"""The trainer's rollout gate: only rollouts a quorum of the version's validators accepted reach training."""

from __future__ import annotations

import dataclasses
import os

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from swarm.event_types import WaitingForValidators
from swarm.policy.runspec import RunSpec
from swarm.roles.gate import JUDGED_BEHIND, RolloutGate
from swarm.roles.trainer import gate_counts
from verify.checks import CheckResult
from verify.rollout import Completion, RolloutGroup
from verify.votes import assign_validators, public_key_of, sign_vote


def trainer_context(data_dir, validator_keys, quorum=2, **parts):
    """The parts of the trainer role's context that SwarmPublisher and the batch wait read, with `parts` (its peer
    table, events, mirror) as each test needs them."""
    from types import SimpleNamespace

    return SimpleNamespace(peer=SimpleNamespace(data_dir=data_dir), identity=None,
                           settings=SimpleNamespace(trainer=SimpleNamespace(validator_keys=validator_keys,
                                                                            quorum=quorum), piece_kb=256), **parts)


def keys(n):
    return [Ed25519PrivateKey.generate().private_bytes_raw() for _ in range(n)]


def spec(validators, prompts=2) -> RunSpec:
    """`prompts` per worker: the gate refuses a worker's groups for more distinct slots of a version."""
    return RunSpec("basic_arithmetic", 64, "{}", 0, 0.2, "all", prompts, 2, 2, 2,
                   tuple(public_key_of(k).hex() for k in validators))


def group(version=1, step=None, worker="w1", task=3, reward=1.0) -> RolloutGroup:
    completion = Completion((5, 6, 7), (-0.1, -0.2, -0.3), "eos", reward, b"\x00" * 4)
    return RolloutGroup("run", version, os.urandom(32), worker, version if step is None else step, "basic_arithmetic",
                        task, (1, 2), 0.6, 16, (completion, completion))


def gate_with(validators, newest=1, prompts=2) -> RolloutGate:
    gate = RolloutGate("run", replicas=2, quorum=2, timeout_s=10.0, async_level=1)
    for v in range(newest + 1):
        gate.specs[v] = spec(validators, prompts)
    gate.newest = newest
    return gate


def vote(key, g, accept=True):
    return sign_vote(key, g.rollout_id(), accept, [CheckResult("reward", accept, "" if accept else "fabricated")])


def assigned(keys_, g):
    chosen = assign_validators(g.slot().key(), [public_key_of(k) for k in keys_], 2)
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


def counts(gate, workers=()):
    """The gate as the batch wait reads it: plain values (swarm.roles.trainer.gate_counts)."""
    return gate_counts(gate, set(workers))


def accept(gate, validators, g, now=0.0):
    assert gate.on_rollout(g, now) == "opened"
    for k in assigned(validators, g):
        gate.on_vote(vote(k, g), now)


def test_batches_stay_inside_the_async_window_when_workers_outpace_the_trainer():
    """Two workers answer 8 prompts per version, a step takes 4: the surplus must expire, never reach training.

    A first-in-first-out gate handed the trainer ever older groups, which the training run's admission refused:
    from the fourth step on every batch of the simulation was empty and the reward read as 0.0.
    """
    from trainer.admission import GenerationContract, Window, refusal

    validators = keys(2)
    gate = gate_with(validators, newest=0)
    for version in range(8):  # the trainer is at `version`; every worker answered it
        gate.specs[version], gate.newest = spec(validators, prompts=4), version
        for task in range(8):
            accept(gate, validators, group(version=version, worker=f"w{task % 2}", task=task))
        batch = gate.take(4)
        contracts = {v: GenerationContract(2, 0.6, 16) for v in range(version + 1)}
        window = Window("run", version, gate.async_level, frozenset(range(version + 1)), contracts)
        assert len(batch) == 4 and all(refusal(g, window, set()) is None for g in batch)
        assert {g.policy_version for g in batch} == {version}  # the freshest groups first
    assert gate.counts["expired"] == 4 * 6  # each version's 4 leftovers expire once two versions newer exist


def test_groups_that_aged_out_while_waiting_expire_instead_of_filling_a_batch():
    validators = keys(2)
    gate = gate_with(validators, newest=1)
    old, fresh = group(version=0, task=1), group(version=1, task=2)
    accept(gate, validators, old)
    accept(gate, validators, fresh)
    gate.specs[2], gate.newest = spec(validators), 2  # v0 is now two versions behind (async level 1)
    assert gate.expire() == 1 and gate.take(4) == [fresh] and gate.counts["expired"] == 1


def test_a_version_naming_fewer_validators_than_the_quorum_refuses_rollouts_without_blaming_the_worker():
    """The default recipe (replicas 2, quorum 2) with one validator: each honest group would be settled as rejected
    (its one assigned validator's accept can never make a quorum of 2) and the worker banned; neither happens."""
    validators = keys(1)
    gate = gate_with(validators)
    for task in range(8):
        assert gate.on_rollout(group(worker="honest", task=task), float(task)) == "fewer validators than the quorum"
    assert gate.counts == {"refused:fewer validators than the quorum": 8}
    assert gate.reputation.score("honest") == 0.0 and not gate.reputation.is_banned("honest")
    assert not spec(validators).quorum_reachable() and spec(keys(2)).quorum_reachable()


async def test_the_trainer_publishes_no_version_until_a_quorum_of_validators_is_heard_from(autojump_clock, tmp_path):
    """A version names its validators for good: the publisher waits, saying so every 20 s, for `quorum` of them."""
    from types import SimpleNamespace

    import trio

    from p2p.identity import peer_id_from_public_bytes
    from swarm.roles.trainer import SwarmPublisher

    emitted = []
    node = trainer_context(tmp_path, (), peer_roles={},
                           events=SimpleNamespace(emit=emitted.append))
    publisher = SwarmPublisher(node, cfg=None)
    validators = [peer_id_from_public_bytes(public_key_of(k)) for k in keys(2)]
    done = trio.Event()

    async def wait() -> None:
        await publisher.wait_for_quorum(2)
        done.set()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(wait)
        node.peer_roles[validators[0]] = ("validator",)
        await trio.sleep(45)
        assert not done.is_set()
        assert [(type(e), e.known, e.quorum) for e in emitted] == [(WaitingForValidators, 1, 2)] * 2
        node.peer_roles[validators[1]] = ("validator",)
        with trio.fail_after(1):
            await done.wait()


def test_rollouts_waiting_on_a_validator_that_left_time_out_when_it_is_no_longer_heard_from():
    validators = keys(2)
    gate = gate_with(validators)
    present = {public_key_of(k) for k in validators}
    gate.on_validators(present, 0.0)
    g = group(worker="honest")
    assert gate.on_rollout(g, 1.0) == "opened"
    first, second = assigned(validators, g)
    gate.on_vote(vote(first, g), 2.0)
    gate.on_validators(present - {public_key_of(second)}, 32.0)
    assert gate.pending == {} and gate.counts.get("timed_out") == 1 and gate.accepted == []
    assert gate.reputation.score("honest") == 0.0


def test_a_peer_that_also_validates_is_never_assigned_its_own_rollouts():
    """Otherwise its accepting vote counted toward the quorum of rollouts it generated itself."""
    from p2p.identity import peer_id_from_public_bytes
    from swarm.roles.validator import assigned_to_me

    validators = keys(2)
    both = peer_id_from_public_bytes(public_key_of(validators[0]))  # generates and validates under one key
    version = spec(validators)
    assert version.validators_for(both) == (public_key_of(validators[1]),)
    assert version.validators_for("12D3KooWother") == version.validator_keys()
    groups = [group(worker=both, task=t) for t in range(20)]
    assert not any(assigned_to_me(g.slot().key(), both, version, public_key_of(validators[0])) for g in groups)
    gate = RolloutGate("run", replicas=2, quorum=1, timeout_s=10.0, async_level=1)
    gate.specs[1], gate.newest = dataclasses.replace(version, quorum=1), 1
    g = groups[0]
    assert gate.on_rollout(g, 0.0) == "opened"
    assert gate.on_vote(vote(validators[0], g), 1.0) == "unassigned" and gate.accepted == []
    assert gate.on_vote(vote(validators[1], g), 1.0) == "counted" and gate.accepted == [g]
    strict = gate_with(validators)  # quorum 2 of the one other validator: refused, and nobody blamed
    assert strict.on_rollout(group(worker=both, task=99), 0.0) == "fewer validators than the quorum"
    from swarm.roles.inference import unanswerable

    assert "its quorum needs 2 other than this peer" in unanswerable(version, both, 1)  # so it does not generate
    assert unanswerable(version, "12D3KooWother", 1) == ""


def test_a_trainer_given_validator_keys_names_only_those_and_reports_the_others_once(tmp_path):
    from types import SimpleNamespace

    from p2p.identity import peer_id_from_public_bytes
    from swarm.roles.trainer import SwarmPublisher

    listed, stranger = [public_key_of(k) for k in keys(2)]
    emitted = []
    node = trainer_context(tmp_path, (peer_id_from_public_bytes(listed),),  # a peer id, as every peer prints its own
                           peer_roles={}, events=SimpleNamespace(emit=lambda e: emitted.append(e.peer)))
    publisher = SwarmPublisher(node, cfg=None)
    for key in (listed, stranger):
        node.peer_roles[peer_id_from_public_bytes(key)] = ("validator",)
    assert publisher.known_validators() == (listed.hex(),)
    assert publisher.known_validators() == (listed.hex(),)
    assert emitted == [peer_id_from_public_bytes(stranger)]


def test_the_gate_forgets_what_the_async_window_left_behind_so_a_long_run_stays_bounded():
    validators = keys(2)
    gate = gate_with(validators, newest=0)
    for version in range(30):
        gate.specs[version], gate.newest = spec(validators, prompts=4), version
        for task in range(4):
            accept(gate, validators, group(version=version, task=task), now=10.0 * version)
        gate.take(4)
        gate.forget_old(now=10.0 * version)
    window = list(range(29 - 1 - JUDGED_BEHIND, 30))  # the async window and the versions still judged behind it
    assert sorted(gate.specs) == window and gate.slots.versions() == set(window) and len(gate.slots) == 4 * len(window)
    assert len(gate.tracker._settled) <= 4 * 3  # settled within the last two timeouts (20 s) only
    replay = group(version=3)
    assert gate.on_rollout(replay, 300.0) == "too stale"  # what it forgot is refused all the same


def test_a_worker_whose_false_claims_always_come_too_late_to_train_on_is_still_judged_and_banned():
    """Every rollout of a late cheater is refused as too stale, yet its quorum still settles: the rejections cost
    its worker, and nothing judged only ever reaches training, even when a quorum accepts it."""
    validators = keys(2)
    gate = gate_with(validators, newest=4)
    honest_late = group(version=2, worker="slow", task=0)
    assert gate.on_rollout(honest_late, 0.0) == "too stale"
    for k in assigned(validators, honest_late):
        gate.on_vote(vote(k, honest_late), 0.0)
    assert gate.counts.get("accepted") == 1 and gate.take(8) == []
    for version in (0, 1, 2):  # each version's prompts per worker (2) are judged
        for task in (0, 1):
            late = group(version=version, worker="cheat", task=task)
            if gate.on_rollout(late, 1.0) == "too stale":
                for k in assigned(validators, late):
                    gate.on_vote(vote(k, late, accept=False), 1.0)
    assert gate.is_banned("cheat") and not gate.is_banned("slow") and gate.accepted == []
    assert gate.on_rollout(group(version=4 - 1 - JUDGED_BEHIND - 1, worker="x"), 2.0) == "too stale"
    assert not gate.pending and not gate.judged_only


def test_late_rollouts_are_judged_only_within_each_workers_prompts_and_a_global_bound():
    """Made-up late groups (no validator votes on them, so their quorums time out) must not grow the gate: past a
    version's prompts per worker they are refused unjudged, and the slots, answers and pending rollouts stay flat."""
    from swarm.roles.gate import MAX_JUDGED_ONLY

    validators = keys(2)
    gate = gate_with(validators, newest=6)
    for task in range(500):
        assert gate.on_rollout(group(version=3, worker="flood", task=task), 1.0) == "too stale"
    assert len(gate.pending) == len(gate.judged_only) == 2 and len(gate.slots) == 2  # prompts_per_worker
    assert 3 not in gate.answers  # late answers never count towards a version answered in full
    for worker in range(MAX_JUDGED_ONLY + 50):  # fresh identities: the global bound holds them
        gate.on_rollout(group(version=3, worker=f"id{worker}", task=0), 1.0)
    assert len(gate.judged_only) == MAX_JUDGED_ONLY
    gate.tick(1.0 + 3 * gate.timeout_s)
    assert not gate.pending and not gate.judged_only and not gate.is_banned("flood")  # timed out: nobody scored


def test_a_flood_of_early_votes_from_keys_no_version_names_cannot_evict_the_honest_ones():
    """Votes may come before their rollout and wait in a bounded buffer; any key could sign them, so a flood of
    votes for made-up rollouts evicted the honest early votes and an accepted rollout timed out instead."""
    validators = keys(2)
    gate = gate_with(validators)
    gate.tracker.config = type(gate.tracker.config)(replicas=2, quorum=2, timeout_s=10.0, max_early_votes=100)
    g = group()
    for k in validators:  # both votes arrive before the rollout
        assert gate.on_vote(vote(k, g), 0.5) == "early"
    mallory = keys(1)[0]
    for _ in range(300):
        assert gate.on_vote(vote(mallory, group()), 0.6) == "not a validator"
    assert gate.on_rollout(g, now=1.0) == "opened"
    assert gate.take(8) == [g]  # the early votes settled it at once
    assert gate.counts["vote:not a validator of the run"] == 300


def near_duplicates(g: RolloutGroup) -> dict[str, RolloutGroup]:
    """The same work sent again with other bytes: each is a new rollout by its bytes, the same one by its slot."""
    first, second = g.completions
    jittered = dataclasses.replace(first, logprobs=(first.logprobs[0] + 0.001,) + first.logprobs[1:])
    return {"jittered logprob": dataclasses.replace(g, completions=(jittered, second)),
            "subset": dataclasses.replace(g, completions=(first,)),
            "reordered": dataclasses.replace(g, completions=(second, first))}


def test_a_second_group_for_an_answered_slot_is_refused_whatever_its_bytes_and_costs_its_worker():
    validators = keys(2)
    gate = gate_with(validators)
    first = Completion((5, 6, 7), (-0.1, -0.2, -0.3), "eos", 1.0, b"\x00" * 4)
    second = Completion((5, 8, 7), (-0.1, -0.4, -0.3), "eos", 0.0, b"\x01" * 4)
    g = dataclasses.replace(group(worker="replayer"), completions=(first, second))
    accept(gate, validators, g)
    assert gate.on_rollout(g, 1.0) == "duplicate"  # a gossip echo of the same bytes: refused, nobody blamed
    assert gate.reputation.score("replayer") > 0
    for name, copy in near_duplicates(g).items():
        assert copy.rollout_id() != g.rollout_id(), name
        assert gate.on_rollout(copy, 2.0) == "another group for an answered slot", name
    assert gate.reputation.score("replayer") < 0 and gate.counts["refused:another group for an answered slot"] == 3
    assert gate.take(8) == [g] and not gate.pending  # the work reaches training once
    for attempt in range(3):  # replaying it again and again gets the worker banned
        gate.on_rollout(dataclasses.replace(g, manifest_id=bytes([attempt]) * 32), 3.0)
    assert gate.reputation.is_banned("replayer")


def test_slots_differ_by_worker_task_version_and_step_only():
    g = group(version=2, task=3)
    assert g.slot().key() == dataclasses.replace(g, manifest_id=bytes(32), temperature=9.0).slot().key()
    for other in (dataclasses.replace(g, worker="w2"), dataclasses.replace(g, task_index=4),
                  dataclasses.replace(g, policy_version=3), dataclasses.replace(g, step=1),
                  dataclasses.replace(g, run="other"), dataclasses.replace(g, dataset="chain_sum")):
        assert other.slot().key() != g.slot().key()
