"""Property-based fuzzing of every decoder of network input (the registry in swarm.bench.fuzz_targets).

Property: for any input, a decoder returns a value or raises the errors its target lists; nothing else. Inputs
are valid encodings mutated by swarm.bench.fuzz_mutations, driven by hypothesis's random (replayable), plus raw bytes.
Bounded examples and no deadline keep the whole file under a minute on two cores; `swarm bench fuzz` runs longer.
"""

from __future__ import annotations

import random

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from swarm.bench.fuzz_mutations import mutate, mutate_tree, place_value, splice
from swarm.bench.fuzz_targets import BY_NAME, TARGETS, FuzzTarget, failure_of

FUZZ = settings(max_examples=150, deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
GENERATED = settings(FUZZ, max_examples=50)
"""Fewer examples where hypothesis builds each value: generating nested trees costs more than decoding them."""

NETWORK_DECODERS = {
    "envelope", "heartbeat", "heartbeat_status", "manifest_announcement", "vote_gossip", "rollout_gossip",
    "vote_batch", "rollout_body", "rollout_group", "rollout_blob", "run_spec", "manifest", "signed_manifest",
    "self_signed_manifest", "dht_record", "piece_frames", "channel_request", "channel_offer", "preamble_head",
    "channel_records",
}


def test_the_registry_covers_every_decoder_of_network_input():
    assert set(BY_NAME) >= NETWORK_DECODERS
    assert len(BY_NAME) == len(TARGETS)


@pytest.mark.parametrize("target", TARGETS, ids=lambda t: t.name)
def test_every_valid_sample_decodes(target):
    """The seeds are valid encodings: mutations then start from inputs that reach every check."""
    samples = target.samples()
    assert samples
    for sample in samples:
        target.decode(sample)


def _hostile(target: FuzzTarget, rng: random.Random, raw: bytes | None) -> bytes:
    if raw is not None:
        return raw
    samples = target.samples()
    if rng.random() < 0.1:
        return splice(rng.choice(samples), rng.choice(samples), rng)
    return mutate(rng.choice(samples), rng, prefix=target.frame_prefix)


@pytest.mark.parametrize("target", TARGETS, ids=lambda t: t.name)
@FUZZ
@given(rng=st.randoms(use_true_random=False), raw=st.none() | st.binary(max_size=256))
def test_a_decoder_returns_a_value_or_raises_only_its_own_error(target, rng, raw):
    data = _hostile(target, rng, raw)
    assert failure_of(target, data) is None


MSGPACK_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1) | st.floats() | st.text(max_size=24)
    | st.binary(max_size=40),
    lambda children: st.lists(children, max_size=6)
    | st.dictionaries(st.text(max_size=12) | st.integers(-5, 5) | st.binary(max_size=4), children, max_size=6),
    max_leaves=24,
)
"""Any value msgpack can carry, nested: what a hostile peer can put in any field."""


@pytest.mark.parametrize("target", TARGETS, ids=lambda t: t.name)
@GENERATED
@given(rng=st.randoms(use_true_random=False), value=MSGPACK_VALUES)
def test_any_msgpack_value_in_any_field_is_a_value_or_the_decoders_own_error(target, rng, value):
    """Structure-aware: a generated value replaces one field of a valid sample, at any depth."""
    sample = rng.choice(target.samples())
    data = mutate_tree(sample, rng, target.frame_prefix, edit=lambda tree, r: place_value(tree, value, r))
    if data is not None:  # None: the edited tree cannot be encoded (a float map key, a frame past its length)
        assert failure_of(target, data) is None


def _breaks_on_wrong_tensor_file(data: bytes) -> object:
    """A decoder with the bug the attacker used: a tensor entry's file looked up without a type check."""
    from p2p.pieces.manifest import decode_manifest

    raw = msgpack.unpackb(data, raw=False, strict_map_key=False)
    if isinstance(raw, dict) and isinstance(raw.get("tensors"), list):
        sizes = {"model-00000.safetensors": 1}
        for entry in raw["tensors"]:
            if isinstance(entry, dict) and "file" in entry:
                entry["file"] in sizes  # noqa: B015 - raises TypeError for an unhashable file name
    return decode_manifest(data)


def test_the_mutations_reach_inside_a_tensor_entry_and_the_property_catches_the_crash():
    """The fuzzing can fail: given the decoder bug of the attack, seeded mutations find it within 3,000 inputs."""
    from p2p.errors import ManifestError
    from swarm.bench.fuzz import fuzz

    buggy = FuzzTarget("buggy_manifest", _breaks_on_wrong_tensor_file, BY_NAME["manifest"].samples,
                       (ManifestError, msgpack.UnpackException, ValueError))
    report = fuzz([buggy], seconds=60.0, seed=1, max_inputs=3000)
    assert report["failures"], report["inputs"]
    finding = report["failures"][0]
    assert finding["target"] == "buggy_manifest" and finding["type"] == "TypeError"
    assert failure_of(buggy, bytes.fromhex(finding["input_hex"])) is not None  # the reproducer reproduces
