"""Policy manifests: built from real safetensors files, signed, and refused when tampered with or mis-signed."""

from __future__ import annotations

import json

import blake3
import msgpack
import numpy as np
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from safetensors.numpy import save_file

from p2p.errors import ManifestError
from p2p.pieces.manifest import (
    MIN_PIECE_SIZE,
    GenerationSettings,
    build_manifest,
    decode_manifest,
    sign_manifest,
    verify_manifest,
)

GEN = GenerationSettings(group_size=8, temperature=0.6, max_new_tokens=256, stage=1)


def make_policy(path, seed=0, sizes=(300_000, 70_000)):
    """Write a small two-file policy directory; returns the tensors written."""
    path.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    tensors = {}
    for i, n in enumerate(sizes):
        part = {f"layer{i}.w": rng.standard_normal(n, dtype=np.float32), f"layer{i}.b": np.arange(7, dtype=np.int64)}
        save_file(part, str(path / f"model-{i:05d}.safetensors"))
        tensors.update(part)
    (path / "model.json").write_text(json.dumps({"architecture": "Qwen2ForCausalLM", "hidden": 64, "rope": 1e4}))
    return tensors


def keypair():
    key = Ed25519PrivateKey.generate()
    raw = key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return key.sign, raw


def build(path, **kw):
    args = dict(run="run-a", version=3, parent_version=2, created_at=1700000000.0, generation=GEN,
                piece_size=MIN_PIECE_SIZE)
    args.update(kw)
    return build_manifest(path, **args)


def test_pieces_hash_the_file_bytes_and_cover_every_byte(tmp_path):
    tensors = make_policy(tmp_path)
    m = build(tmp_path)
    for f in m.files:
        data = (tmp_path / f.name).read_bytes()
        assert f.size == len(data)
        assert [blake3.blake3(data[o : o + f.piece_size]).digest() for o in range(0, len(data), f.piece_size)] == list(
            f.piece_hashes
        )
        assert f.root == blake3.blake3(b"".join(f.piece_hashes)).digest()
    assert m.num_pieces == sum(len(f.piece_hashes) for f in m.files)
    assert [p.index for p in m.pieces] == list(range(m.num_pieces))
    # the tensor index points at the raw bytes of every tensor
    for t in m.tensors:
        raw = (tmp_path / t.file).read_bytes()[t.offset : t.offset + t.nbytes]
        assert np.array_equal(np.frombuffer(raw, dtype=tensors[t.name].dtype), tensors[t.name].ravel())
        assert t.shape == tensors[t.name].shape


def test_id_is_stable_and_depends_on_content(tmp_path):
    make_policy(tmp_path / "a", seed=1)
    make_policy(tmp_path / "b", seed=1)
    make_policy(tmp_path / "c", seed=2)
    a, b, c = build(tmp_path / "a"), build(tmp_path / "b"), build(tmp_path / "c")
    assert a.id == b.id and a.id != c.id
    assert build(tmp_path / "a", version=4).id != a.id
    assert decode_manifest(a.encode()) == a


def test_sign_and_verify_round_trip(tmp_path):
    make_policy(tmp_path)
    sign, pub = keypair()
    m = build(tmp_path)
    signed = sign_manifest(m, sign, pub).to_bytes()
    back = verify_manifest(signed, pub)
    assert back == m and back.id == m.id and back.generation == GEN


def test_wrong_key_is_refused(tmp_path):
    make_policy(tmp_path)
    sign, pub = keypair()
    _, other = keypair()
    signed = sign_manifest(build(tmp_path), sign, pub).to_bytes()
    with pytest.raises(ManifestError, match="trainer key"):
        verify_manifest(signed, other)


def test_signature_by_another_key_claiming_the_trainer_key_is_refused(tmp_path):
    make_policy(tmp_path)
    _, pub = keypair()
    forger_sign, _ = keypair()
    signed = sign_manifest(build(tmp_path), forger_sign, pub).to_bytes()
    with pytest.raises(ManifestError, match="signature"):
        verify_manifest(signed, pub)


def test_tampered_manifest_is_refused(tmp_path):
    make_policy(tmp_path)
    sign, pub = keypair()
    signed = sign_manifest(build(tmp_path), sign, pub)
    outer = msgpack.unpackb(signed.to_bytes())
    inner = msgpack.unpackb(outer["m"])
    inner["version"] = 99  # still canonical, but no longer what was signed
    outer["m"] = msgpack.packb(inner)
    with pytest.raises(ManifestError, match="signature"):
        verify_manifest(msgpack.packb(outer), pub)


@pytest.mark.parametrize(
    "mutate",
    [
        lambda d: d["files"][0].update(name="../etc/passwd"),
        lambda d: d["files"][0].update(root=b"\x00" * 32),
        lambda d: d["files"][0]["piece_hashes"].pop(),
        lambda d: d["files"][0].update(piece_size=1024),
        lambda d: d["tensors"][0].update(offset=10**12),
        lambda d: d.update(extra=1),
        lambda d: d.update(version=-1),
        lambda d: d.update(format=1),
    ],
)
def test_malformed_manifests_are_refused(tmp_path, mutate):
    make_policy(tmp_path)
    raw = msgpack.unpackb(build(tmp_path).encode())
    mutate(raw)
    with pytest.raises(ManifestError):
        decode_manifest(msgpack.packb(raw))


def test_non_canonical_encoding_is_refused(tmp_path):
    make_policy(tmp_path)
    raw = msgpack.unpackb(build(tmp_path).encode())
    reordered = dict(reversed(list(raw.items())))
    with pytest.raises(ManifestError, match="canonical"):
        decode_manifest(msgpack.packb(reordered))


@pytest.mark.parametrize("blob", [b"", b"\xc1", msgpack.packb([1, 2]), msgpack.packb({"m": b"", "k": b"x", "s": b""}),
                                  b"\x00" * (33 << 20)])
def test_garbage_signed_bytes_are_refused(blob):
    with pytest.raises(ManifestError):
        verify_manifest(blob, b"\x00" * 32)


def test_piece_size_outside_limits_is_refused(tmp_path):
    make_policy(tmp_path)
    with pytest.raises(ManifestError, match="piece size"):
        build(tmp_path, piece_size=1000)


def test_a_data_file_travels_as_pieces_beside_the_weights_and_names_no_tensor(tmp_path):
    make_policy(tmp_path)
    rows = b"".join(b'{"prompt": "%d + 1 =", "answer": "%d"}\n' % (i, i + 1) for i in range(20_000))
    (tmp_path / "arith.jsonl").write_bytes(rows)
    m = build(tmp_path, data_files=("arith.jsonl",))
    data = next(f for f in m.files if f.name == "arith.jsonl")
    assert data.size == len(rows) and len(data.piece_hashes) == -(-len(rows) // MIN_PIECE_SIZE) > 1
    assert data.root == blake3.blake3(b"".join(data.piece_hashes)).digest()
    assert all(t.file != "arith.jsonl" for t in m.tensors)
    assert decode_manifest(m.encode()) == m  # receivers accept it like any other manifest
    assert build(tmp_path).id != m.id  # and it is part of what the trainer signs


@pytest.mark.parametrize("name", ["model.json", "model-00000.safetensors", "../arith.jsonl", "missing.jsonl"])
def test_a_data_file_must_be_a_plain_non_weight_file_of_the_directory(tmp_path, name):
    make_policy(tmp_path)
    with pytest.raises(ManifestError):
        build(tmp_path, data_files=(name,))


def _empty_arrays(count: int) -> bytes:
    """One msgpack array of `count` empty arrays: one byte each on the wire, a Python list each once decoded."""
    return b"\xdd" + count.to_bytes(4, "big") + b"\x90" * count


@pytest.mark.parametrize("decode", ["signed", "manifest"])
def test_a_body_of_empty_arrays_is_refused_without_inflating_into_python_objects(decode):
    """8 MiB of them took 578 MiB and 3 s to decode before any field was checked (a data-channel preamble or a
    manifest fetch can carry 32 MiB)."""
    import tracemalloc

    from p2p.pieces.manifest import decode_manifest, decode_signed

    bomb = _empty_arrays(4 << 20)
    if decode == "signed":
        bomb = b"\x83\xa1m" + bomb + b"\xa1k" + b"\xc4\x20" + bytes(32) + b"\xa1s" + b"\xc4\x40" + bytes(64)
    tracemalloc.start()
    try:
        with pytest.raises(ManifestError):
            (decode_signed if decode == "signed" else decode_manifest)(bomb)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 64 << 20
