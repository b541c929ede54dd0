"""Votes (signatures, parsing), rendezvous assignment, the quorum state machine on virtual time, reputation."""

from __future__ import annotations

import collections

import blake3
import pytest

from verify.checks import CheckResult
from verify.quorum import Outcome, QuorumConfig, QuorumTracker
from verify.reputation import Reputation, ReputationConfig
from verify.votes import Vote, VoteError, assign_validators, public_key_of, sign_vote, verify_vote

KEYS = [blake3.blake3(f"validator-{i}".encode()).digest() for i in range(6)]
PUBS = [public_key_of(k) for k in KEYS]
BY_PUB = dict(zip(PUBS, KEYS))
RID = blake3.blake3(b"rollout").digest()
CHECKS = (CheckResult("toploc", True), CheckResult("reward", True))


def vote(pub: bytes, accept: bool, rid: bytes = RID) -> Vote:
    return sign_vote(BY_PUB[pub], rid, accept, CHECKS)


def test_vote_signature_round_trip_and_tampering():
    v = sign_vote(KEYS[0], RID, False, [CheckResult("toploc", False, "chunk 0: 3 of 128 exponents match")])
    assert verify_vote(v)
    parsed = Vote.from_wire(v.to_wire())
    assert parsed == v and verify_vote(parsed)
    flipped = Vote(v.rollout_id, v.validator, True, v.checks, v.signature)
    assert not verify_vote(flipped)
    stolen = Vote(v.rollout_id, PUBS[1], v.accept, v.checks, v.signature)
    assert not verify_vote(stolen)


@pytest.mark.parametrize(
    "wire",
    [
        None,
        {},
        {"v": 1},
        {"v": 1, "rollout_id": b"x", "validator": b"y" * 32, "accept": True, "checks": [], "sig": b"s" * 64},
        {"v": 1, "rollout_id": RID, "validator": PUBS[0], "accept": 1, "checks": [], "sig": b"s" * 64},
        {"v": 1, "rollout_id": RID, "validator": PUBS[0], "accept": True, "checks": [["a", True]], "sig": b"s" * 64},
        {
            "v": 1,
            "rollout_id": RID,
            "validator": PUBS[0],
            "accept": True,
            "checks": [["a", True, "r"]] * 99,
            "sig": b"s" * 64,
        },
    ],
)
def test_malformed_votes_are_refused(wire):
    with pytest.raises(VoteError):
        Vote.from_wire(wire)


def test_rendezvous_assignment_is_deterministic_balanced_and_stable():
    rids = [blake3.blake3(i.to_bytes(4, "little")).digest() for i in range(600)]
    first = [assign_validators(r, PUBS, 3) for r in rids]
    assert first == [assign_validators(r, list(reversed(PUBS)), 3) for r in rids]
    load = collections.Counter(v for a in first for v in a)
    assert all(250 <= load[p] <= 350 for p in PUBS)  # 600 * 3 / 6 = 300 each
    without = [assign_validators(r, PUBS[:-1], 3) for r in rids]
    # removing one validator only changes the rollouts it held
    assert all(a == b for a, b in zip(first, without) if PUBS[-1] not in a)


def test_quorum_accepts_at_q_and_ignores_bad_votes():
    tracker = QuorumTracker(QuorumConfig(replicas=3, quorum=2, timeout_s=10))
    assigned, _ = tracker.open(RID, RID, PUBS, now=0.0)
    outsider = next(p for p in PUBS if p not in assigned)
    assert tracker.on_vote(vote(outsider, True), 1.0) == ("unassigned", None)
    forged = Vote(RID, assigned[0], True, (), b"\0" * 64)
    assert tracker.on_vote(forged, 1.0) == ("forged", None)
    assert tracker.on_vote(vote(assigned[0], True), 1.0) == ("counted", None)
    assert tracker.on_vote(vote(assigned[0], True), 1.5) == ("duplicate", None)
    status, settled = tracker.on_vote(vote(assigned[1], True), 2.0)
    assert status == "counted" and settled.outcome is Outcome.ACCEPTED and settled.at == 2.0
    assert tracker.outcome(RID) is Outcome.ACCEPTED
    assert tracker.on_vote(vote(assigned[2], False), 3.0) == ("settled", None)
    assert tracker.forget_settled(before=2.0) == 0 and tracker.forget_settled(before=2.5) == 1
    assert tracker.outcome(RID) is None


def test_a_verifier_verdict_becomes_a_counted_vote():
    from verify.verifier import Verdict
    from verify.votes import vote_from_verdict

    tracker = QuorumTracker(QuorumConfig(replicas=2, quorum=2))
    assigned, _ = tracker.open(RID, RID, PUBS, now=0.0)
    verdict = Verdict(RID, False, (CheckResult("schema", True), CheckResult("toploc", False, "chunk 0: bad")))
    v = vote_from_verdict(BY_PUB[assigned[0]], verdict)
    assert v.checks == (("schema", True, ""), ("toploc", False, "chunk 0: bad")) and not v.accept
    status, settled = tracker.on_vote(v, 1.0)
    assert status == "counted" and settled.outcome is Outcome.REJECTED  # 1 of 2 rejecting: accept is out of reach


def test_quorum_rejects_on_majority_and_when_accept_is_out_of_reach():
    tracker = QuorumTracker(QuorumConfig(replicas=3, quorum=2))
    assigned, _ = tracker.open(RID, RID, PUBS, now=0.0)
    tracker.on_vote(vote(assigned[0], True), 1.0)
    _, s = tracker.on_vote(vote(assigned[1], False), 1.0)
    assert s is None
    _, s = tracker.on_vote(vote(assigned[2], False), 2.0)
    assert s.outcome is Outcome.REJECTED and s.votes == {assigned[0]: True, assigned[1]: False, assigned[2]: False}

    strict = QuorumTracker(QuorumConfig(replicas=3, quorum=3))
    rid2 = blake3.blake3(b"other").digest()
    assigned, _ = strict.open(rid2, rid2, PUBS, now=0.0)
    _, s = strict.on_vote(vote(assigned[0], False, rid2), 1.0)
    assert s.outcome is Outcome.REJECTED  # one reject makes 3 accepts impossible


def test_quorum_timeouts_run_on_virtual_time():
    tracker = QuorumTracker(QuorumConfig(replicas=3, quorum=2, timeout_s=30))
    assigned, _ = tracker.open(RID, RID, PUBS, now=100.0)
    tracker.on_vote(vote(assigned[0], True), 110.0)
    assert tracker.next_deadline() == 130.0
    assert tracker.tick(129.9) == []
    (settled,) = tracker.tick(130.0)
    assert settled.outcome is Outcome.TIMED_OUT and settled.votes == {assigned[0]: True}
    assert tracker.next_deadline() is None


def test_votes_before_their_rollout_are_buffered_and_replayed():
    tracker = QuorumTracker(QuorumConfig(replicas=3, quorum=2))
    assigned = assign_validators(RID, PUBS, 3)
    assert tracker.on_vote(vote(assigned[0], True), 0.0)[0] == "early"
    assert tracker.on_vote(vote(assigned[1], True), 0.0)[0] == "early"
    _, settled = tracker.open(RID, RID, PUBS, now=1.0)
    assert [s.outcome for s in settled] == [Outcome.ACCEPTED]


def test_reputation_bans_cheaters_and_dissenting_validators_but_not_honest_peers():
    tracker = QuorumTracker(QuorumConfig(replicas=3, quorum=2))
    rep = Reputation(ReputationConfig(credit=0.1, penalty=1.0, ceiling=2.0, ban_below=-3.0))
    for i in range(8):
        rid = blake3.blake3(f"r{i}".encode()).digest()
        assigned, _ = tracker.open(rid, rid, PUBS[:3], now=0.0)  # exactly three validators: all assigned
        liar = PUBS[2]
        settled = None
        for pub in assigned:
            # the cheater's rollouts are bad (honest validators reject), the liar always accepts
            _, s = tracker.on_vote(vote(pub, pub == liar, rid), 1.0)
            settled = settled or s
        rep.settle(settled, worker="cheater")
    assert rep.is_banned("cheater") and rep.is_banned(PUBS[2])
    assert not rep.is_banned(PUBS[0]) and rep.score(PUBS[0]) == pytest.approx(0.8)
    for _ in range(30):
        rep.record("honest", True)
    assert rep.score("honest") == 2.0  # capped: history cannot pay for a burst of cheating
    for _ in range(5):
        rep.record("honest", False)
    assert rep.is_banned("honest") and rep.score("honest") == pytest.approx(-3.0)


def test_a_rollout_that_needs_a_departed_validators_vote_times_out_at_once_and_blames_nobody():
    tracker = QuorumTracker(QuorumConfig(replicas=2, quorum=2, timeout_s=120))
    assigned, _ = tracker.open(RID, RID, PUBS[:2], now=0.0)
    tracker.on_vote(vote(assigned[0], True), 1.0)
    (settled,) = tracker.validator_gone(assigned[1], now=31.0)
    assert settled.outcome is Outcome.TIMED_OUT and settled.at == 31.0 and settled.votes == {assigned[0]: True}
    later = blake3.blake3(b"opened after it left").digest()  # a rollout of a version that still names it
    _, (settled,) = tracker.open(later, later, PUBS[:2], now=32.0)
    assert settled.outcome is Outcome.TIMED_OUT
    tracker.validator_back(assigned[1])  # restarted with its key: it owes votes again
    again = blake3.blake3(b"after it came back").digest()
    assert tracker.open(again, again, PUBS[:2], now=40.0)[1] == [] and tracker.outcome(again) is Outcome.PENDING


def test_a_departed_validator_leaves_alone_the_rollouts_others_can_still_accept():
    tracker = QuorumTracker(QuorumConfig(replicas=3, quorum=2, timeout_s=120))
    assigned, _ = tracker.open(RID, RID, PUBS[:3], now=0.0)
    assert tracker.validator_gone(assigned[2], now=5.0) == []  # two live validators can still make 2 accepts
    tracker.on_vote(vote(assigned[0], True), 6.0)
    _, settled = tracker.on_vote(vote(assigned[1], True), 7.0)
    assert settled.outcome is Outcome.ACCEPTED


def test_too_few_assigned_validators_time_a_rollout_out_instead_of_rejecting_it():
    """Fewer validators than the quorum is no fault of the worker: a REJECTED here banned honest workers."""
    tracker = QuorumTracker(QuorumConfig(replicas=2, quorum=2))
    (only,), settled = tracker.open(RID, RID, PUBS[:1], now=0.0)
    assert [s.outcome for s in settled] == [Outcome.TIMED_OUT]
    reputation = Reputation()
    reputation.settle(settled[0], "honest worker")
    assert reputation.score("honest worker") == 0.0
