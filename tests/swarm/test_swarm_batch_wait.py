"""The trainer's wait for a batch: when it trains on what it holds, when it is starved, and when it sends a
version out early, and why (swarm.roles.batch_wait, pure over plain values)."""

from __future__ import annotations

import dataclasses

from tests.swarm.test_swarm_gate import accept, assigned, counts, gate_with, group, keys, spec, trainer_context, vote
from verify.votes import public_key_of


def test_a_batch_one_group_short_is_trained_once_nothing_more_can_come_and_reported_meanwhile():
    from swarm.roles.batch_wait import BatchWait

    validators = keys(2)
    gate = gate_with(validators, prompts=8)  # one worker answers the version's groups as they come
    wait = BatchWait(wanted=4, since=100.0, patience_s=30.0, report_every_s=20.0)
    for task in range(3):  # the fourth group of this version was lost: no worker will send another
        accept(gate, validators, group(task=task))
    assert not wait.ready(counts(gate), 110.0) and not wait.should_report(110.0)
    assert wait.should_report(121.0) and not wait.should_report(130.0)
    assert wait.status(counts(gate), 130.0).ready == 3 and wait.status(counts(gate), 130.0).waited_s == 30.0
    pending = group(task=7)
    gate.on_rollout(pending, 135.0)  # a quorum still open: its group may yet complete the batch
    assert not wait.ready(counts(gate), 150.0)
    for k in assigned(validators, pending):
        gate.on_vote(vote(k, pending), 151.0)
    assert wait.ready(counts(gate), 151.0) and len(gate.take(4)) == 4
    for task in range(3):
        accept(gate, validators, group(task=10 + task))
    assert not wait.ready(counts(gate), 160.0)
    assert not wait.ready(counts(gate), 189.0)  # 30 s since the last group arrived
    assert wait.ready(counts(gate), 191.0) and len(gate.take(4)) == 3
    assert not BatchWait(wanted=4, since=0.0).ready(counts(gate), 1000.0)  # nothing to train on: keep waiting


def test_a_trainer_with_nothing_to_train_on_and_nothing_coming_is_starved_until_it_waits_afresh():
    from swarm.roles.batch_wait import BatchWait

    validators = keys(2)
    gate = gate_with(validators)
    wait = BatchWait(wanted=4, since=100.0, patience_s=30.0)
    assert not wait.ready(counts(gate), 120.0) and not wait.starved(counts(gate), 120.0)
    pending = group(task=7)
    gate.on_rollout(pending, 125.0)
    assert not wait.ready(counts(gate), 140.0) and not wait.starved(counts(gate), 140.0)  # a quorum is still open
    gate.tick(136.0)  # its votes never came: the quorum times out (10 s)
    assert not gate.pending and not wait.ready(counts(gate), 141.0)
    assert wait.starved(counts(gate), 141.0)  # time to publish early
    assert not wait.starved_long(counts(gate), 141.0) and wait.starved_long(counts(gate), 100.0 + wait.retry_after_s)
    wait.restart(141.0)
    assert not wait.starved(counts(gate), 160.0) and wait.starved(counts(gate), 171.0)
    assert not wait.starved_long(counts(gate), 171.0) and wait.starved_long(counts(gate), 141.0 + wait.retry_after_s)
    accept(gate, validators, group(task=1))
    assert not wait.ready(counts(gate), 172.0) and not wait.starved(counts(gate), 300.0)
    assert wait.ready(counts(gate), 300.0)


def test_the_publisher_notices_when_a_versions_validators_are_not_the_ones_around(tmp_path):
    """A version published before its validators announced themselves names none and can never be accepted; a
    starved trainer republishes when the validators it hears from differ from those the newest version names."""

    from p2p.identity import peer_id_from_public_bytes
    from swarm.roles.trainer import SwarmPublisher

    validators = keys(2)
    node = trainer_context(tmp_path, (), peer_roles={})
    publisher = SwarmPublisher(node, cfg=None)
    nobody = spec([])
    assert not publisher.validators_changed(nobody)  # none known: a new version would name none either
    assert not publisher.workers_known()
    for k in validators:
        node.peer_roles[peer_id_from_public_bytes(public_key_of(k))] = ("validator",)
    node.peer_roles["12D3KooWCRdwY7d9wf6inqzAJLp86LghWeBAoQX5Lo6T7T3uXXN7"] = ("inference",)
    assert publisher.validators_changed(nobody) and publisher.workers_known()
    assert not publisher.validators_changed(spec(validators[::-1]))  # the same set, in any order
    assert publisher.validators_changed(spec(validators[:1]))  # one joined since


def test_a_validator_leaving_sends_a_new_version_out_at_once_unless_votes_are_awaited_or_ready_groups_would_expire(
        tmp_path):
    """Rollouts of a version whose validators left are refused on arrival, so the trainer publishes a version naming
    those around as soon as no vote is awaited, not after `patience_s` of quiet; but not below a quorum, not
    without workers, and not when synchronous with groups ready (the new version would expire them)."""
    from types import SimpleNamespace

    from p2p.identity import peer_id_from_public_bytes
    from swarm.roles.batch_wait import BatchWait, why_publish_now
    from swarm.roles.trainer import SwarmPublisher, swarm_facts

    validators = keys(3)
    node = trainer_context(tmp_path, (), quorum=2, mirror=SimpleNamespace(policies={}),
                           peer_roles={"12D3KooWCRdwY7d9wf6inqzAJLp86LghWeBAoQX5Lo6T7T3uXXN7": ("inference",)})
    publisher = SwarmPublisher(node, cfg=None)
    for k in validators[:2]:  # the third stopped sending heartbeats
        node.peer_roles[peer_id_from_public_bytes(public_key_of(k))] = ("validator",)
    gate = gate_with(validators)
    waiting = BatchWait(wanted=4, since=0.0)
    run = SimpleNamespace(trained_since_publish=False)

    def why(now=1.0):
        return why_publish_now(counts(gate, publisher.known_workers()), swarm_facts(node, run, publisher, gate),
                               waiting, now)

    assert publisher.validators_departed(gate.specs[1]) == 1
    assert "1 of the validators it names left" in why()  # 1 s in: no patience waited out
    gate.on_rollout(group(), 0.5)
    assert why() is None  # a vote is still awaited: it may complete the batch
    gate.pending.clear()
    gate.accepted.append(group())
    assert "left" in why()  # ready groups stay in the async window of the next version
    gate.async_level = 0
    assert why() is None  # synchronous: the next version would expire them; train on them after patience_s
    gate.async_level, gate.accepted = 1, []
    gate.specs[1] = spec(validators[:2])
    assert why() is None  # the newest version names exactly those around
    gate.specs[1] = spec(validators)
    del node.peer_roles[peer_id_from_public_bytes(public_key_of(validators[1]))]
    assert why() is None  # one validator left: a new version would wait for a quorum anyway


def test_a_version_every_worker_answered_in_full_is_replaced_at_once_or_trained_on_when_synchronous(tmp_path):
    """One worker answering 2 prompts per version against a batch of 4: the version brings nothing more once both
    groups came, so the trainer publishes again at once (async: the held group stays in the window), or trains on
    what it holds at once when synchronous, without waiting `patience_s` of quiet each time."""
    from types import SimpleNamespace

    from p2p.identity import peer_id_from_public_bytes
    from swarm.roles.batch_wait import BatchWait, why_publish_now
    from swarm.roles.trainer import SwarmPublisher, swarm_facts

    validators = keys(2)
    worker = "12D3KooWCRdwY7d9wf6inqzAJLp86LghWeBAoQX5Lo6T7T3uXXN7"
    node = trainer_context(tmp_path, (), quorum=2, peer_roles={worker: ("inference",)},
                           mirror=SimpleNamespace(policies={}))
    for k in validators:
        node.peer_roles[peer_id_from_public_bytes(public_key_of(k))] = ("validator",)
    publisher = SwarmPublisher(node, cfg=None)
    gate = gate_with(validators)  # specs name 2 prompts per worker
    waiting = BatchWait(wanted=4, since=0.0)
    run = SimpleNamespace(trained_since_publish=False)

    def settle(g):
        for k in assigned(validators, g):
            gate.on_vote(vote(k, g), 1.0)

    def why(now):
        return why_publish_now(counts(gate, publisher.known_workers()), swarm_facts(node, run, publisher, gate),
                               waiting, now)

    first = group(worker=worker, task=1)
    gate.on_rollout(first, 0.5)
    settle(first)
    assert not gate.answered_in_full(1, publisher.known_workers())
    assert not waiting.ready(counts(gate), 1.0) and why(1.0) is None
    gate.on_rollout(first, 1.5)  # a resent group is not a second answer
    assert not gate.answered_in_full(1, publisher.known_workers())
    second = group(worker=worker, task=2)
    gate.on_rollout(second, 1.5)
    assert gate.answered_in_full(1, publisher.known_workers())
    assert why(2.0) is None  # its votes are still awaited
    settle(second)
    # async: two of four, and a new version keeps them
    assert not waiting.ready(counts(gate, publisher.known_workers()), 2.0)
    assert "every inference peer sent its 2 groups" in why(2.0)
    gate.async_level = 0
    # synchronous: train on the two now instead of after patience_s
    assert waiting.ready(counts(gate, publisher.known_workers()), 2.0)
    gate.async_level = 1
    assert not gate.answered_in_full(1, publisher.known_workers() | {"another-worker"})  # it has not answered
    for _ in range(4):
        gate.reputation.record(worker, good=False)
    assert not gate.answered_in_full(1, publisher.known_workers())  # only banned workers: never answered in full


def test_the_decision_to_publish_early_is_pure_over_plain_values():
    """why_publish_now reads plain values only (what the gate holds, what the trainer hears of its swarm, the time),
    so every branch is checked here without a gate, a node or a clock."""
    from swarm.roles.batch_wait import BatchWait, GateCounts, SwarmFacts, why_publish_now

    facts = SwarmFacts(quorum_here=True, workers_known=True, validators_departed=0, validators_changed=False,
                       newest_held=2, trained_since_publish=False)
    gate = GateCounts(ready=0, awaiting_votes=0, async_level=1, newest=2, prompts_per_worker=2)
    waiting = BatchWait(wanted=4, since=0.0, patience_s=30.0, retry_after_s=120.0)
    assert why_publish_now(gate, facts, waiting, 10.0) is None  # nothing wrong, and not starved yet
    assert why_publish_now(gate, facts, waiting, 31.0) is None  # starved, but nothing says a new version helps
    assert "peers hold v3" in why_publish_now(gate, dataclasses.replace(facts, newest_held=3), waiting, 31.0)
    assert "answered it" in why_publish_now(gate, dataclasses.replace(facts, trained_since_publish=True), waiting, 31.0)
    assert "other validators" in why_publish_now(gate, dataclasses.replace(facts, validators_changed=True), waiting,
                                                 31.0)
    assert "lost" in why_publish_now(gate, facts, waiting, 120.0)
    assert why_publish_now(dataclasses.replace(gate, awaiting_votes=1), facts, waiting, 120.0) is None  # votes due
    left = dataclasses.replace(facts, validators_departed=1)
    assert "1 of the validators it names left" in why_publish_now(gate, left, waiting, 1.0)  # at once
    assert why_publish_now(gate, dataclasses.replace(left, quorum_here=False), waiting, 1.0) is None
    assert why_publish_now(dataclasses.replace(gate, ready=1, async_level=0), left, waiting, 1.0) is None
    full = dataclasses.replace(gate, answered_in_full=True)
    assert "sent its 2 groups" in why_publish_now(full, facts, waiting, 1.0)
    assert waiting.ready(dataclasses.replace(full, ready=2, async_level=0), 1.0)  # synchronous: train on what it has
    assert not waiting.ready(dataclasses.replace(full, ready=2), 1.0)  # async: a new version keeps the two
