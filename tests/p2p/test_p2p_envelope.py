"""Envelopes, the replay filter and peer scores: pure code, no network, no clock."""

from __future__ import annotations

import dataclasses
import math

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from p2p.errors import EnvelopeError, P2PError
from p2p.gossip.envelope import (
    DEFAULT_POLICY,
    DOMAIN,
    KINDS,
    EnvelopePolicy,
    make_replay_filter,
    open_envelope,
    seal,
)
from p2p.gossip.replay import ReplayFilter
from p2p.identity import Identity
from p2p.scores import PeerScores, ScoreConfig, Verdict

ALICE = Identity(bytes(range(32)))
MALLORY = Identity(bytes(range(1, 33)))
NOW = 1_000_000.0


def reason_of(data: bytes, run: str = "run1", now: float = NOW, **kw) -> str:
    with pytest.raises(EnvelopeError) as info:
        open_envelope(data, run, now, **kw)
    assert isinstance(info.value, P2PError) and info.value.user_facing
    return info.value.reason


def resign(fields: dict, identity: Identity) -> bytes:
    """Re-sign tampered fields the way an attacker holding `identity` would (same canonical form as `seal`)."""
    signed = {k: fields[k] for k in sorted(fields) if k != "sig"}
    fields["sig"] = identity.sign(DOMAIN + msgpack.packb(signed, use_bin_type=True))
    return msgpack.packb(fields, use_bin_type=True)


def test_round_trip_keeps_every_field():
    body = {"z": [1, 2.5, b"\x00"], "a": {"nested": None, 3: True}}
    env = open_envelope(seal("vote", "run1", body, ALICE, NOW - 1, 7), "run1", NOW)
    assert (env.v, env.kind, env.run, env.ts, env.seq) == (1, "vote", "run1", NOW - 1, 7)
    assert env.sender == ALICE.public_bytes and env.body == body and len(env.sig) == 64
    assert env.sender_peer_id == ALICE.peer_id


def test_a_handler_reads_the_decoded_body_only_as_the_type_it_names():
    env = open_envelope(seal("vote", "run1", {"a": 1}, ALICE, NOW - 1, 7), "run1", NOW)
    decoded = dataclasses.replace(env, message=(1, 2))
    assert decoded.decoded(tuple) == (1, 2)
    with pytest.raises(TypeError, match="a vote envelope carries tuple, not dict"):
        decoded.decoded(dict)
    with pytest.raises(TypeError, match="carries NoneType"):  # no decoder ran
        env.decoded(tuple)


def test_signature_covers_values_not_encoding():
    """A relay that re-encodes the map in another key order must not break the signature."""
    data = seal("have", "run1", {"b": 1, "a": 2}, ALICE, NOW, 1)
    fields = msgpack.unpackb(data, raw=False)
    reordered = msgpack.packb(dict(reversed(list(fields.items()))), use_bin_type=True)
    assert reordered != data
    assert open_envelope(reordered, "run1", NOW).body == {"a": 2, "b": 1}


@pytest.mark.parametrize("field,value", [
    ("body", {"x": 2}), ("seq", 8), ("ts", NOW - 2.0), ("kind", "have"), ("sender", MALLORY.public_bytes),
])
def test_any_tampered_field_breaks_the_signature(field, value):
    fields = msgpack.unpackb(seal("vote", "run1", {"x": 1}, ALICE, NOW, 7), raw=False)
    fields[field] = value
    assert reason_of(msgpack.packb(fields, use_bin_type=True)) == "bad_signature"


def test_forged_sender_and_stripped_signature_are_refused():
    fields = msgpack.unpackb(seal("vote", "run1", {"x": 1}, ALICE, NOW, 7), raw=False)
    fields["sig"] = MALLORY.sign(b"anything").ljust(64, b"\x00")
    assert reason_of(msgpack.packb(fields, use_bin_type=True)) == "bad_signature"
    del fields["sig"]
    assert reason_of(msgpack.packb(fields, use_bin_type=True)) == "malformed"


def test_signature_from_another_domain_does_not_verify():
    """A trainer signature over the same bytes without the envelope domain (e.g. a manifest) must not pass."""
    fields = msgpack.unpackb(seal("manifest", "run1", {"id": b"m"}, ALICE, NOW, 1), raw=False)
    signed = {k: fields[k] for k in sorted(fields) if k != "sig"}
    fields["sig"] = ALICE.sign(msgpack.packb(signed, use_bin_type=True))
    assert reason_of(msgpack.packb(fields, use_bin_type=True)) == "bad_signature"


def test_wrong_run_unknown_kind_and_bad_version():
    assert reason_of(seal("vote", "run2", {}, ALICE, NOW, 1)) == "wrong_run"
    fields = msgpack.unpackb(seal("vote", "run1", {}, ALICE, NOW, 1), raw=False)
    assert reason_of(resign({**fields, "kind": "gimme"}, ALICE)) == "unknown_kind"
    assert reason_of(resign({**fields, "v": 2}, ALICE)) == "bad_version"
    with pytest.raises(EnvelopeError) as info:
        seal("gimme", "run1", {}, ALICE, NOW, 1)
    assert info.value.reason == "unknown_kind"


def test_freshness_window_edges():
    policy = EnvelopePolicy(max_age_s=60, max_future_s=5)
    assert open_envelope(seal("vote", "run1", {}, ALICE, NOW - 60, 1), "run1", NOW, policy).seq == 1
    assert reason_of(seal("vote", "run1", {}, ALICE, NOW - 60.5, 2), policy=policy) == "too_old"
    assert open_envelope(seal("vote", "run1", {}, ALICE, NOW + 5, 3), "run1", NOW, policy).seq == 3
    assert reason_of(seal("vote", "run1", {}, ALICE, NOW + 5.5, 4), policy=policy) == "from_future"


def test_per_kind_size_limits_on_both_sides():
    big = {"blob": b"x" * 5000}
    assert open_envelope(seal("rollout", "run1", big, ALICE, NOW, 1), "run1", NOW).body == big
    with pytest.raises(EnvelopeError) as info:
        seal("rollout_ann", "run1", big, ALICE, NOW, 1)
    assert info.value.reason == "oversized"
    fields = msgpack.unpackb(seal("rollout", "run1", big, ALICE, NOW, 1), raw=False)
    assert reason_of(resign({**fields, "kind": "rollout_ann"}, ALICE)) == "oversized"
    assert reason_of(b"\x00" * (DEFAULT_POLICY.largest + 1)) == "oversized"


def test_replay_is_refused_but_only_after_the_signature():
    replay = make_replay_filter()
    data = seal("vote", "run1", {}, ALICE, NOW, 5)
    fields = msgpack.unpackb(data, raw=False)
    forged = msgpack.packb({**fields, "body": {"evil": 1}}, use_bin_type=True)
    assert reason_of(forged, replay=replay) == "bad_signature"
    assert open_envelope(data, "run1", NOW, replay=replay).seq == 5  # the forgery did not burn seq 5
    assert reason_of(data, replay=replay) == "replayed"
    assert open_envelope(seal("vote", "run1", {}, ALICE, NOW, 6), "run1", NOW, replay=replay).seq == 6
    assert open_envelope(seal("vote", "run1", {}, MALLORY, NOW, 5), "run1", NOW, replay=replay).seq == 5


def test_replay_filter_memory_is_bounded_and_fails_closed():
    flt = ReplayFilter(window_s=100, capacity=3)
    for seq in range(3):
        assert flt.accept(b"a", seq, ts=10.0 + seq, now=20.0)
    assert flt.accept(b"a", 3, ts=9.0, now=20.0)  # evicts the oldest timestamp: 9.0
    assert len(flt) == 3 and flt.floor == 9.0
    assert not flt.accept(b"b", 0, ts=8.5, now=20.0)  # at or below the floor: refused, never re-admitted
    assert not flt.accept(b"a", 1, ts=11.0, now=20.0)  # still remembered
    assert flt.accept(b"a", 99, ts=15.0, now=20.0)
    assert not flt.accept(b"a", 99, ts=15.0, now=20.0)


def test_replay_filter_forgets_entries_that_left_the_window():
    flt = ReplayFilter(window_s=10, capacity=100)
    for seq in range(50):
        assert flt.accept(b"a", seq, ts=float(seq), now=float(seq))
    # at now=49 only ts 39..49 are inside the window; older ones are left to the envelope's own ts check
    assert len(flt) == 11
    assert flt.is_fresh(b"a", 38, ts=49.0, now=49.0) and not flt.is_fresh(b"a", 39, ts=49.0, now=49.0)


@given(st.binary(max_size=2048))
@settings(max_examples=400, deadline=None)
def test_fuzz_arbitrary_bytes_only_raise_envelope_error(data):
    try:
        open_envelope(data, "run1", NOW, replay=make_replay_filter())
    except EnvelopeError as exc:
        assert exc.reason in {"malformed", "oversized", "bad_version", "unknown_kind", "wrong_run",
                              "too_old", "from_future", "bad_signature", "replayed"}


plain = st.recursive(
    st.none() | st.booleans() | st.integers(-2**63, 2**64 - 1) | st.floats(allow_nan=False) | st.text(max_size=8)
    | st.binary(max_size=8),
    lambda kids: st.lists(kids, max_size=4)
    | st.dictionaries(st.text(max_size=4) | st.integers(-2**63, 2**64 - 1), kids, max_size=4),
    max_leaves=20,
)


VALID = msgpack.unpackb(seal("vote", "run1", {"ok": 1}, ALICE, NOW, 3), raw=False)


@given(st.dictionaries(st.sampled_from(["v", "kind", "run", "sender", "ts", "seq", "body", "sig", "x"]), plain,
                       min_size=1, max_size=3))
@settings(max_examples=150, deadline=None)
def test_fuzz_mutated_envelopes_are_refused_or_unchanged(overrides):
    """Overwrite up to three fields of a valid envelope with arbitrary values: any real change is refused."""
    fields = {**VALID, **overrides}
    try:
        env = open_envelope(msgpack.packb(fields, use_bin_type=True), "run1", NOW)
    except EnvelopeError:
        # compare encodings, not dicts: True == 1 in Python, yet {"v": True} is a real (refused) change on the wire
        assert msgpack.packb(fields, use_bin_type=True) != msgpack.packb(VALID, use_bin_type=True)
    else:
        assert (env.kind, env.seq, env.body, env.sig) == ("vote", 3, {"ok": 1}, VALID["sig"])


@given(st.dictionaries(st.text(max_size=6), plain, max_size=6), st.sampled_from(KINDS))
@settings(max_examples=100, deadline=None)
def test_fuzz_valid_bodies_round_trip(body, kind):
    try:
        data = seal(kind, "run1", body, ALICE, NOW, 1)
    except EnvelopeError as exc:  # only a size refusal, or one of a NaN or infinity, is acceptable for a plain body
        assert exc.reason == "oversized" or (exc.reason == "malformed" and not _all_finite(body))
        return
    assert open_envelope(data, "run1", NOW).body == body


def _all_finite(value) -> bool:
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, dict):
        return all(_all_finite(v) for v in value.values())
    if isinstance(value, list):
        return all(_all_finite(v) for v in value)
    return True


def test_unencodable_bodies_are_refused_at_seal():
    for body in ({"big": 2**64}, {"obj": object()}, {1.5: "float key"}, [1, 2]):
        with pytest.raises(EnvelopeError) as info:
            seal("vote", "run1", body, ALICE, NOW, 1)
        assert info.value.reason == "malformed"


def test_deep_bodies_are_refused_without_recursion_errors():
    deep: list = []
    for _ in range(40):
        deep = [deep]
    with pytest.raises(EnvelopeError):
        seal("vote", "run1", {"d": deep}, ALICE, NOW, 1)
    raw = b"\x91" * 5000 + b"\xc0"  # 5000 nested one-element arrays as a body
    fields = msgpack.unpackb(seal("vote", "run1", {}, ALICE, NOW, 1), raw=False)
    data = msgpack.packb({**fields, "body": None}, use_bin_type=True).replace(b"\xa4body\xc0", b"\xa4body" + raw)
    assert reason_of(data) == "malformed"


def test_scores_ban_repeat_forgers_and_forgive_with_time():
    scores = PeerScores(ScoreConfig(ban_threshold=-50, half_life_s=100, ban_s=600))
    assert scores.penalize("p", "bad_signature", 0.0) is Verdict.KEEP  # -20
    assert scores.penalize("p", "bad_signature", 0.0) is Verdict.KEEP  # -40
    assert scores.score("p", 100.0) == pytest.approx(-20.0)  # halved after one half-life
    assert scores.penalize("p", "bad_signature", 100.0) is Verdict.KEEP  # -40
    assert scores.penalize("p", "malformed", 100.0) is Verdict.BAN  # -60
    assert scores.is_banned("p", 699.0) and scores.banned(699.0) == ["p"]
    assert scores.penalize("p", "too_old", 699.0) is Verdict.BAN
    assert scores.tick(699.0) == [] and scores.tick(700.0) == ["p"]
    assert not scores.is_banned("p", 700.0) and scores.score("p", 700.0) == 0.0


def test_scores_weigh_reasons_and_stay_bounded():
    scores = PeerScores(ScoreConfig(max_peers=3))
    for i in range(10):
        scores.penalize(f"stale{i}", "too_old", 0.0)
    scores.penalize("forger", "bad_signature", 0.0)
    assert scores.score("forger", 0.0) == -20.0
    tracked = [p for p in [f"stale{i}" for i in range(10)] + ["forger"] if scores.score(p, 0.0) < 0]
    assert len(tracked) == 3 and "forger" in tracked
