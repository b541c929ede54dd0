"""The one manifest decoder: a field of the wrong type or range anywhere, tensor entries included, is a
ManifestError and nothing else, on the signed path as on the bare one."""

from __future__ import annotations

import math

import msgpack
import pytest

from p2p.errors import ManifestError
from p2p.pieces.manifest import decode_manifest, open_signed_manifest, sign_manifest
from tests.p2p.test_p2p_manifest import build, keypair, make_policy


def _tensor(field, value):
    return lambda d: d["tensors"][0].update({field: value})


WRONG_FIELDS = [
    _tensor("file", []),  # unhashable: `[] in sizes` raised TypeError, which only some receivers caught
    _tensor("file", {"a": 1}),
    _tensor("file", 7),
    _tensor("name", 5),
    _tensor("name", ""),
    _tensor("dtype", ["F32"]),
    _tensor("dtype", "F32; rm -rf"),
    _tensor("shape", "abc"),
    _tensor("shape", [[1]]),
    _tensor("shape", [-1]),
    _tensor("shape", [1] * 33),
    _tensor("offset", 1.5),
    _tensor("nbytes", True),
    lambda d: d["tensors"].append(dict(d["tensors"][0])),  # the same tensor twice
    lambda d: d["tensors"].append([1, 2]),
    lambda d: d.update(created_at=math.nan),
    lambda d: d.update(created_at=math.inf),
    lambda d: d.update(version=2**64 - 1),
    lambda d: d.update(run=""),
    lambda d: d.update(format=True),
    lambda d: d["generation"].update(temperature=math.inf),
    lambda d: d["generation"].update(temperature=math.nan),
    lambda d: d["generation"].update(group_size=2**40),
    lambda d: d["generation"].update(stage=-1),
    lambda d: d["model"].update(rope=math.nan),
    lambda d: d["model"].update(blob=b"\x00"),
    lambda d: d["model"].update(deep=_nested(40)),
    lambda d: d["files"][0].update(name=["x"]),
    lambda d: d["files"][0].update(size=-5),
]


def _nested(depth):
    value = []
    for _ in range(depth):
        value = [value]
    return value


@pytest.mark.parametrize("mutate", WRONG_FIELDS)
def test_a_field_of_the_wrong_type_or_range_is_a_manifest_error(tmp_path, mutate):
    make_policy(tmp_path)
    raw = msgpack.unpackb(build(tmp_path).encode())
    mutate(raw)
    with pytest.raises(ManifestError, match="malformed"):
        decode_manifest(msgpack.packb(raw, use_bin_type=True))


def test_a_self_signed_manifest_with_a_wrong_tensor_entry_is_refused_without_a_trainer_key(tmp_path):
    """The attack: a stranger signs a manifest of the right run whose tensor entry names its file by a list."""
    make_policy(tmp_path)
    sign, pub = keypair()
    raw = msgpack.unpackb(build(tmp_path).encode())
    raw["tensors"][0]["file"] = []
    encoded = msgpack.packb(raw, use_bin_type=True)

    class Forged:
        def encode(self):
            return encoded

    signed = sign_manifest(Forged(), sign, pub).to_bytes()
    with pytest.raises(ManifestError, match="tensor file"):
        open_signed_manifest(signed, None)


def test_open_signed_manifest_returns_the_manifest_and_its_signer(tmp_path):
    make_policy(tmp_path)
    sign, pub = keypair()
    manifest = build(tmp_path)
    signed = sign_manifest(manifest, sign, pub).to_bytes()
    opened = open_signed_manifest(signed)
    assert opened.manifest == manifest and opened.signer == pub
    assert open_signed_manifest(signed, pub).manifest.id == manifest.id
    with pytest.raises(ManifestError, match="trainer key"):
        open_signed_manifest(signed, bytes(32))


@pytest.mark.parametrize("data", [None, "text", 7, ["m"]])
def test_something_other_than_bytes_is_a_manifest_error(data):
    with pytest.raises(ManifestError):
        decode_manifest(data)
    with pytest.raises(ManifestError):
        open_signed_manifest(data)


def test_a_decoded_manifest_is_read_only_down_to_its_model_description(tmp_path):
    import copy
    import dataclasses

    make_policy(tmp_path)
    manifest = build(tmp_path)
    model_id = manifest.id
    with pytest.raises(dataclasses.FrozenInstanceError):
        manifest.version = 9
    with pytest.raises(TypeError, match="read-only"):
        manifest.model["architecture"] = "Evil"
    with pytest.raises(TypeError, match="read-only"):
        manifest.model.update(extra=1)
    assert isinstance(manifest.model, dict) and copy.deepcopy(manifest.model) == manifest.model
    assert decode_manifest(manifest.encode()).id == model_id == manifest.id
    from swarm.bench.fuzz_targets import sample_manifest

    nested = decode_manifest(sample_manifest().encode()).model
    with pytest.raises(TypeError, match="read-only"):
        nested["run_spec"]["quorum"] = 0
