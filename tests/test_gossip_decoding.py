"""Received gossip is bounded before and while it is decoded: admission budgets (pure), the envelope's container
budget, non-finite numbers, the typed bodies of every kind, and rollout refusals that keep no inflated buffers."""

from __future__ import annotations

import gc
import time
import tracemalloc
import zlib
from types import SimpleNamespace

import msgpack
import pytest

from p2p.errors import EnvelopeError
from p2p.gossip.admission import AdmissionConfig, GossipAdmission
from p2p.gossip.envelope import DEFAULT_POLICY, open_envelope, seal
from p2p.identity import Identity
from swarm.bench.gossip_flood import inflating_envelope
from swarm.messages.gossip_bodies import decode_manifest_announcement, decode_rollouts, decode_votes
from swarm.messages.rollout_transport import items_or_refusal
from swarm.messages.votes import vote_bodies
from verify.votes import sign_vote

ALICE = Identity(bytes([7]) * 32)
NOW = 1_000_000.0


# ---- admission: per-sender rates and budgets, one for the node ---------------------------------------------------

def test_a_peers_heartbeats_are_admitted_at_most_one_per_interval_after_a_burst_of_two():
    gate = GossipAdmission(AdmissionConfig(heartbeat_interval_s=3.0))
    admitted = [gate.admit("heartbeat", "p", "p", 100, t * 0.001) is None for t in range(1000)]  # 1000/s for 1 s
    assert sum(admitted) == 2
    assert gate.admit("heartbeat", "p", "p", 100, 1.0) == "rate_limited"
    assert gate.admit("heartbeat", "p", "p", 100, 4.0) is None  # one more per 3 s
    honest = GossipAdmission(AdmissionConfig(heartbeat_interval_s=3.0))
    assert all(honest.admit("heartbeat", "h", "h", 2000, 6.0 * i) is None for i in range(100))  # every 6 s: all


def test_one_sender_gets_its_byte_budget_whoever_relays_it_and_refusals_cost_nothing():
    config = AdmissionConfig(sender_bytes_per_s=1_000_000, sender_burst_bytes=2_000_000, message_cost_bytes=0)
    gate = GossipAdmission(config)
    sizes = [gate.admit("rollout", "mallory", f"relay{i % 3}", 900_000, 0.0) for i in range(4)]
    assert sizes == [None, None, "flooding", "flooding"]
    assert gate.admit("rollout", "mallory", "relay0", 900_000, 1.0) is None  # refilled, nothing spent on refusals
    assert gate.admit("vote", "honest", "relay0", 1000, 1.0) is None  # another origin through the same relay


def test_a_relay_may_carry_many_origins_up_to_its_share_of_the_node_budget_and_nobody_pays_for_its_excess():
    config = AdmissionConfig(node_bytes_per_s=4_000_000, node_burst_bytes=8_000_000, message_cost_bytes=0)
    gate = GossipAdmission(config)
    verdicts = [gate.admit("rollout", f"worker{i}", "relay", 900_000, 0.0) for i in range(6)]
    assert verdicts == [None] * 4 + ["relay_busy"] * 2  # half of the node's 8 MB burst
    assert gate.admit("rollout", "worker9", "other-relay", 900_000, 0.0) is None


def test_any_number_of_fresh_identities_together_stay_within_the_node_budget():
    config = AdmissionConfig(node_bytes_per_s=4_000_000, node_burst_bytes=8_000_000, message_cost_bytes=4096)
    gate = GossipAdmission(config)
    decoded, refused = 0, set()
    for step in range(1000):  # 10 s; each message from a fresh identity and a fresh connection
        now = step * 0.01
        verdict = gate.admit("rollout", f"id{step}", f"conn{step}", 900_000, now)
        decoded += 904_096 if verdict is None else 0
        refused.add(verdict)
    assert decoded <= 8_000_000 + 4_000_000 * 10
    assert refused == {None, "node_busy"}


def test_admission_remembers_a_bounded_number_of_senders():
    config = AdmissionConfig(max_tracked=8)
    gate = GossipAdmission(config)
    for now in (0.0, config.known_after_s + 1):  # strangers first, then the same origins known
        for i in range(1000):
            gate.admit("heartbeat", f"id{i}", f"id{i}", 100, now)
    tables = [*gate._rates.values(), *gate._origin_bytes.values(), gate._forwarder_bytes]
    assert max(len(table._by_key) for table in tables) == 8 and len(gate._known) == 8
    assert len(gate._first_heard) <= 2 * config.stranger_burst  # the strangers' allowance bounds it


# ---- the envelope: budgets while decoding, finite numbers ---------------------------------------------------------

def test_an_envelope_of_empty_maps_stops_at_its_container_budget_without_inflating():
    """Decoded in full, 900 KiB of empty maps take 127 MiB and seconds of CPU per message before any check."""
    data = inflating_envelope("run1", ALICE, NOW, 1)
    assert len(data) <= 900 * 1024
    tracemalloc.start()
    try:
        for kind in ("rollout", None):
            with pytest.raises(EnvelopeError) as refused:
                open_envelope(data, "run1", NOW, kind=kind)
            assert refused.value.reason == "oversized" and "maps and arrays" in str(refused.value)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 8 * 2**20


def test_a_heartbeat_topic_applies_the_heartbeat_limits_before_decoding():
    vote = seal("vote", "run1", {"pad": b"x" * 20_000}, ALICE, NOW, 1)
    with pytest.raises(EnvelopeError) as refused:
        open_envelope(vote, "run1", NOW, kind="heartbeat")  # 20 KB is above a heartbeat's 8 KiB
    assert refused.value.reason == "oversized"
    with pytest.raises(EnvelopeError) as wrong:
        open_envelope(seal("vote", "run1", {}, ALICE, NOW, 2), "run1", NOW, kind="heartbeat")
    assert wrong.value.reason == "malformed"


@pytest.mark.parametrize("number", [float("nan"), float("inf"), float("-inf")])
def test_non_finite_numbers_are_refused_when_sealing_and_when_opening(number):
    with pytest.raises(EnvelopeError):
        seal("heartbeat", "run1", {"progress": {"reward": number}}, ALICE, NOW, 1)
    fields = msgpack.unpackb(seal("heartbeat", "run1", {"progress": {"reward": 0.5}}, ALICE, NOW, 1), raw=False)
    fields["body"]["progress"]["reward"] = number
    with pytest.raises(EnvelopeError) as refused:
        open_envelope(msgpack.packb(fields, use_bin_type=True), "run1", NOW, DEFAULT_POLICY)
    assert refused.value.reason == "malformed"


# ---- typed bodies ---------------------------------------------------------------------------------------------------

def env(body, identity=ALICE):
    return SimpleNamespace(body=body, sender=identity.public_bytes, sender_peer_id=identity.peer_id)


def test_a_manifest_announcement_is_typed_or_refused():
    ann = decode_manifest_announcement(env({"id": bytes(32), "version": 3, "signed": b"m"}))
    assert (ann.manifest_id, ann.version, ann.signed) == (bytes(32), 3, b"m")
    for body in ({"id": bytes(31), "version": 3}, {"id": bytes(32), "version": -1}, {"id": bytes(32)},
                 {"id": bytes(32), "version": 1, "signed": "text"}, {"id": bytes(32), "version": 1, "x": 1}, []):
        with pytest.raises(EnvelopeError):
            decode_manifest_announcement(env(body))


def test_votes_must_all_parse_and_be_signed_by_their_sender():
    check = SimpleNamespace(name="proof", ok=True, reason="")
    mine = [sign_vote(ALICE.seed, bytes([i]) * 32, True, [check]) for i in range(3)]
    assert len(decode_votes(env(vote_bodies(mine)[0])).votes) == 3
    someone = sign_vote(Identity.generate().seed, b"r" * 32, True, [check])
    forged = mine[0].to_wire() | {"accept": False}
    for body in (vote_bodies(mine + [someone])[0], {"votes": [mine[0].to_wire(), forged]},
                 {"votes": [mine[0].to_wire(), {"v": 1}]}, {"votes": []}, {"votes": "x"}):
        with pytest.raises(EnvelopeError):
            decode_votes(env(body))


def test_a_rollout_refusal_keeps_no_inflated_buffer_alive():
    """A refused compressed group's traceback holds its inflated buffer (130 MiB for one 64-item batch): the
    decoder keeps the refusal without it."""
    raw = b"\x00" * (4 << 20)  # inflates fine, then fails the group schema
    body = {"batch": [{"z": zlib.compress(raw), "n": len(raw)}]}
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        items, refusal = items_or_refusal(body)
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert items == [] and refusal.reason == "schema"
    assert held < 2 * 2**20  # 4 MiB were inflated on the way
    with pytest.raises(EnvelopeError) as refused:
        decode_rollouts(env(body))
    assert refused.value.reason == "bad_body"


def test_a_rollout_item_of_another_worker_refuses_the_message():
    ann = {"id": bytes(32), "size": 10, "n": 20, "worker": Identity.generate().peer_id, "rollout": bytes(32),
           "version": 1, "run": "run1", "step": 1, "dataset": "gcd", "task": 3, "addrs": []}
    with pytest.raises(EnvelopeError):
        decode_rollouts(env({"ann": ann}))
    ann["worker"] = ALICE.peer_id
    assert len(decode_rollouts(env({"ann": ann})).items) == 1


def test_a_rollout_message_with_two_items_for_one_slot_is_refused():
    """An honest worker answers a slot once; a message that answers one twice is not forwarded to the run."""
    ann = {"id": bytes(32), "size": 10, "n": 20, "worker": ALICE.peer_id, "rollout": bytes(32), "version": 1,
           "run": "run1", "step": 1, "dataset": "gcd", "task": 3, "addrs": []}
    twice = {**ann, "id": b"\x01" * 32, "rollout": b"\x01" * 32}
    with pytest.raises(EnvelopeError):
        decode_rollouts(env({"batch": [{"ann": ann}, {"ann": twice}]}))
    assert len(decode_rollouts(env({"batch": [{"ann": ann}, {"ann": {**twice, "task": 4}}]})).items) == 2


def test_the_inflating_envelope_builder_is_signed_correctly_so_only_the_budget_refuses_it():
    small = inflating_envelope("run1", ALICE, time.time(), 2, size=2000)
    assert open_envelope(small, "run1", time.time()).kind == "rollout"


def test_event_lines_are_strict_json_even_for_numbers_that_are_not_finite():
    import io
    import json

    from swarm.event_types import TrainStep
    from swarm.events import EventSink

    out = io.StringIO()
    EventSink(json_lines=True, stream=out).emit(TrainStep(step=1, reward=float("nan"), stage="s",
                                                          group_rewards=[float("inf"), 1.0]))
    record = json.loads(out.getvalue(), parse_constant=lambda name: pytest.fail(f"{name} in an event line"))
    assert record["reward"] is None and record["group_rewards"] == [None, 1.0]


def test_a_node_refuses_an_inline_manifest_signed_by_another_key_than_the_runs_before_forwarding_it(tmp_path):
    from swarm.messages.gossip_bodies import run_decoders
    from tests.test_swarm_nodes import signed_checkpoint

    trainer, forger = Identity.generate(), Identity.generate()
    _, manifest, forged = signed_checkpoint(tmp_path / "f", forger, floats=1000)
    _, _, real = signed_checkpoint(tmp_path / "r", trainer, floats=1000)
    decode = run_decoders(lambda: trainer.public_bytes, now=lambda: 0.0)["manifest"]
    for signed in (forged, b"not a manifest", b"\x92\x01"):
        with pytest.raises(EnvelopeError):
            decode(env({"id": manifest.id, "version": 1, "signed": signed}))
    assert decode(env({"id": manifest.id, "version": 1, "signed": real})).signed == real
    assert decode(env({"id": manifest.id, "version": 1})).signed is None  # by id: fetched and verified later
    unknown_key = run_decoders(lambda: None, now=lambda: 0.0)["manifest"]  # no key yet: the mirror pins it
    assert unknown_key(env({"id": manifest.id, "version": 1, "signed": forged})).signed == forged


def test_own_pace_keeps_an_honest_burst_within_what_receivers_admit():
    """Whatever a peer publishes through its own pacing, a receiver with the same limits admits all of it."""
    from p2p.gossip.admission import OwnPace

    config = AdmissionConfig()
    pace, gate = OwnPace(config), GossipAdmission(config)
    now, sent = 0.0, 0
    for i in range(200):  # a worker's burst: 100 large rollout messages and 100 heartbeats, as fast as allowed
        kind, size = ("rollout", 800_000) if i % 2 else ("heartbeat", 2_000)
        now += pace.delay(kind, size, now)
        pace.record(kind, size, now)
        assert gate.admit(kind, "honest", "honest", size, now) is None
        sent += 1
    assert sent == 200


def test_a_publisher_splits_or_refuses_what_receivers_would_refuse_for_its_maps_and_arrays():
    from p2p.gossip.envelope import count_containers
    from swarm.messages.rollout_transport import within_containers

    with pytest.raises(EnvelopeError) as refused:
        seal("heartbeat", "run1", {"x": [[]] * 200}, ALICE, NOW, 1)  # 202 containers: a heartbeat holds 128
    assert refused.value.reason == "oversized"
    tiny = {"group": {"completions": [{"tokens": [1], "logprobs": [-0.1]}] * 40}}  # 122 containers each
    parts = within_containers({"batch": [tiny] * 64}, limit=1000)
    assert len(parts) > 1 and all(count_containers(p) <= 1000 for p in parts)
    assert sum(len(p["batch"]) for p in parts) == 64


def test_a_nodes_own_progress_is_sent_only_as_receivers_accept_it():
    from swarm.messages.gossip_bodies import decode_heartbeat, sendable_progress

    progress = {"step": 3, "reward": float("nan"), "stage": "x" * 50, "nested": {"a": 1}, "accepted": 2}
    assert sendable_progress(progress) == {"step": 3, "accepted": 2}
    assert dict(decode_heartbeat(env({"progress": sendable_progress(progress)})).progress) == {"step": 3, "accepted": 2}


# ---- fuzzing: every typed decoder returns its value or refuses with EnvelopeError, nothing else -----------------

from hypothesis import given, settings  # noqa: E402 - the fuzz section's own imports
from hypothesis import strategies as st  # noqa: E402

from swarm.messages.gossip_bodies import DECODERS, decode_heartbeat  # noqa: E402

_leaf = (st.none() | st.booleans() | st.integers(-2**63, 2**64 - 1) | st.floats(allow_nan=False)
         | st.text(max_size=12) | st.binary(max_size=40))
_plain = st.recursive(_leaf, lambda kids: st.lists(kids, max_size=4)
                      | st.dictionaries(st.text(max_size=8) | st.integers(0, 3), kids, max_size=4), max_leaves=24)


def _valid_bodies() -> dict:
    check = SimpleNamespace(name="proof", ok=True, reason="")
    vote = sign_vote(ALICE.seed, b"v" * 32, True, [check]).to_wire()
    ann = {"id": bytes(32), "size": 10, "n": 20, "worker": ALICE.peer_id, "rollout": bytes(32), "version": 1,
           "run": "run1", "step": 1, "dataset": "gcd", "task": 3, "addrs": []}
    return {"heartbeat": {"roles": ["seed"], "addrs": [f"/ip4/1.2.3.4/tcp/1/p2p/{ALICE.peer_id}"],
                          "policies": [[1, bytes(32), True]], "progress": {"step": 1}},
            "manifest": {"id": bytes(32), "version": 1, "signed": b"m"},
            "vote": {"votes": [vote]}, "rollout": {"batch": [{"ann": ann}]}}


VALID = _valid_bodies()


@given(st.sampled_from(sorted(DECODERS)), st.lists(st.tuples(st.text(max_size=8), _plain), max_size=3), _plain)
@settings(max_examples=300, deadline=None)
def test_fuzz_typed_decoders_refuse_only_with_the_projects_error(kind, overrides, whole):
    """Valid bodies with fields overwritten by arbitrary values, and arbitrary values as whole bodies."""
    mutated = {**VALID[kind], **dict(overrides)}
    for body in (mutated, whole):
        try:
            value = DECODERS[kind](env(body))
        except EnvelopeError as exc:
            assert exc.reason == "bad_body"
        else:
            assert value is not None
    assert decode_heartbeat(env(VALID["heartbeat"])).roles == ("seed",)
