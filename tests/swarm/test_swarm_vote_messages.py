"""Vote bodies: a batch's votes travel in as few messages as the limits allow, each vote intact and still verifiable;
hostile bodies yield the votes that parse and a count of the rest, never an exception."""

from __future__ import annotations

import msgpack

from p2p.gossip.envelope import DEFAULT_MAX_BYTES, seal
from p2p.identity import Identity
from swarm.messages.votes import MAX_VOTES, VOTE_BYTES, vote_bodies, votes_in
from verify.checks import CheckResult
from verify.votes import MAX_CHECKS, MAX_REASON, sign_vote, verify_vote

KEY = bytes(range(32))


def _votes(count: int, reason: str = "", checks: int = 10) -> list:
    checks = [CheckResult(f"check{i}", not reason, reason) for i in range(checks if not reason else MAX_CHECKS)]
    return [sign_vote(KEY, bytes([i % 256, i // 256]) * 16, i % 3 != 0, checks) for i in range(count)]


def test_a_batch_goes_out_as_one_message_and_every_vote_verifies_after_the_trip():
    votes = _votes(40)
    bodies = vote_bodies(votes)
    assert len(bodies) == 1
    received, malformed = votes_in(msgpack.unpackb(msgpack.packb(bodies[0], use_bin_type=True), raw=False))
    assert malformed == 0 and received == votes and all(verify_vote(v) for v in received)


def test_big_batches_are_split_by_count_and_by_size_and_each_message_fits_its_envelope():
    by_count = vote_bodies(_votes(MAX_VOTES + 1, checks=1))
    assert [len(b["votes"]) for b in by_count] == [MAX_VOTES, 1]
    wordy = _votes(30, reason="x" * MAX_REASON)  # the largest votes a validator can write
    by_size = vote_bodies(wordy)
    assert len(by_size) > 1 and sum(len(b["votes"]) for b in by_size) == 30
    for body in by_count + by_size:
        assert len(msgpack.packb(body["votes"], use_bin_type=True)) <= VOTE_BYTES + 16
        seal("vote", "run", body, Identity(KEY), 0.0, 1)  # raises when above the kind's limit
    assert max(len(seal("vote", "run", b, Identity(KEY), 0.0, 1)) for b in by_size) <= DEFAULT_MAX_BYTES["vote"]
    assert [v for b in by_size for v in votes_in(b)[0]] == wordy
    assert vote_bodies([]) == []


def test_the_single_vote_body_of_earlier_releases_is_still_read():
    vote = _votes(1)[0]
    assert votes_in({"vote": vote.to_wire()}) == ([vote], 0)


def test_hostile_bodies_give_the_good_votes_and_count_the_rest():
    good = _votes(2)
    assert votes_in({"votes": [good[0].to_wire(), {"v": 9}, "junk", good[1].to_wire()]}) == (good, 2)
    assert votes_in({"votes": [good[0].to_wire()] * (MAX_VOTES + 1)}) == ([], 1)  # refused unread
    for body in ({"votes": []}, {"votes": "x"}, b"bytes", None, {"vote": None}, {}):
        votes, malformed = votes_in(body)
        assert votes == [] and malformed == 1
