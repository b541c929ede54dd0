"""Policy patches: bit-exact round trips, the encodings chosen, and every hostile patch refused in one line."""

from __future__ import annotations

import msgpack
import numpy as np
import pytest
import torch
import zstandard

from p2p.errors import PatchError
from p2p.pieces.patch import apply_patch, check_blocks, encode_patch, encode_tensor, read_prefix
from p2p.pieces.patch_format import MAGIC, decode_head, encode_head
from swarm.policy.patch_form import expected_tensors
from tests.patch_versions import manifest_of, nudged, parent_and_child, weights, write_version


def rebuild(tmp_path, patch: bytes, parent_dir, child_manifest):
    out = tmp_path / "out"
    out.mkdir(exist_ok=True)
    return apply_patch(patch, [parent_dir / "model.safetensors"], out, expected_tensors(child_manifest))


def test_a_rebuilt_version_is_bit_identical_and_the_patch_is_small(tmp_path):
    parent, child, old, new = parent_and_child(tmp_path)
    patch = (new / "model.patch").read_bytes()
    [rebuilt] = rebuild(tmp_path, patch, old, child)
    assert rebuilt.read_bytes() == (new / "model.safetensors").read_bytes()
    assert len(patch) * 8 < (new / "model.safetensors").stat().st_size  # 3 % of bf16 elements changed


def test_new_tensors_and_changed_dtypes_travel_whole_and_unchanged_ones_not_at_all(tmp_path):
    parent_tensors = weights(0)
    child = nudged(parent_tensors)
    child["extra"] = torch.arange(10, dtype=torch.int64)
    child["head.bias"] = child["head.bias"].to(torch.bfloat16)
    old, new = write_version(tmp_path / "a", parent_tensors), write_version(tmp_path / "b", child)
    stats = encode_patch([old / "model.safetensors"], [new / "model.safetensors"], tmp_path / "p")
    assert stats.full_tensors == 2
    files, _ = decode_head((tmp_path / "p").read_bytes())
    encodings = {t.name: t.encoding for t in files[0].tensors}
    assert encodings["norm"] == "same" and encodings["extra"] == "full" and encodings["head.bias"] == "full"
    assert encodings["embed"] in ("mask", "delta1", "delta2", "delta4")


@pytest.mark.parametrize("share, expected", [(0.0005, "delta"), (0.3, "mask")])
def test_sparse_changes_are_sent_as_gaps_and_dense_ones_as_a_bitmask(share, expected):
    rng = np.random.default_rng(0)
    old = rng.integers(0, 1 << 16, 200_000, dtype=np.uint16)
    new = old.copy()
    new[rng.random(old.size) < share] += 1
    encoding, changed, _, _ = encode_tensor(old.tobytes(), new.tobytes(), 2, 3)
    assert encoding.startswith(expected) and changed == int((old != new).sum())


def _forged(prefix: bytes, entry: list, positions: bytes, values: bytes) -> bytes:
    return encode_head([{"name": "model.safetensors", "header": prefix, "tensors": entry}]) + positions + values


def _embed_only(tmp_path):
    """A one-tensor parent and child (500 bf16 elements) for hand-made patches."""
    base = {"embed": torch.zeros(500, dtype=torch.bfloat16)}
    child = {"embed": base["embed"].clone()}
    child["embed"][[3, 7]] = 1.0
    old = write_version(tmp_path / "p1", base)
    new = write_version(tmp_path / "p2", child)
    return old, new, manifest_of(new, 2), read_prefix(new / "model.safetensors")


def _values(count: int) -> bytes:
    ones = np.frombuffer(torch.ones(count, dtype=torch.bfloat16).view(torch.int16).numpy().tobytes(), np.uint8)
    return zstandard.ZstdCompressor().compress(np.ascontiguousarray(ones.reshape(-1, 2).T).tobytes())


def _gaps(gaps: list[int]) -> bytes:
    return zstandard.ZstdCompressor().compress(np.array(gaps, dtype="<u2").tobytes())


def test_a_hand_made_patch_with_sorted_positions_rebuilds_the_child(tmp_path):
    old, new, manifest, prefix = _embed_only(tmp_path)
    positions, values = _gaps([4, 4]), _values(2)
    patch = _forged(prefix, [["embed", "delta2", 2, len(positions), len(values)]], positions, values)
    [rebuilt] = rebuild(tmp_path, patch, old, manifest)
    assert rebuilt.read_bytes() == (new / "model.safetensors").read_bytes()


@pytest.mark.parametrize("gaps, count, why", [
    ([4, 0], 2, "out of order or twice"),  # a position repeated
    ([9, 2**16 - 1], 2, "out of order or twice"),  # wraps nothing: a gap past the tensor
    ([600], 1, "past the tensor's end"),  # out of range
])
def test_positions_out_of_range_unsorted_or_repeated_are_refused(tmp_path, gaps, count, why):
    old, _, manifest, prefix = _embed_only(tmp_path)
    positions, values = _gaps(gaps), _values(count)
    patch = _forged(prefix, [["embed", "delta2", count, len(positions), len(values)]], positions, values)
    with pytest.raises(PatchError, match="past the tensor's end|out of order or twice|does not match"):
        rebuild(tmp_path, patch, old, manifest)
    assert not list((tmp_path / "out").iterdir())  # nothing kept


def test_a_block_that_inflates_past_its_tensor_is_refused_before_it_is_held(tmp_path):
    old, _, manifest, prefix = _embed_only(tmp_path)
    bomb = zstandard.ZstdCompressor().compress(bytes(64 << 20))  # 64 MiB of zeros for a 1000-byte tensor
    patch = _forged(prefix, [["embed", "full", 500, 0, len(bomb)]], b"", bomb)
    with pytest.raises(PatchError, match="more bytes than its tensor"):
        rebuild(tmp_path, patch, old, manifest)


def test_a_patch_that_does_not_rebuild_the_signed_tensors_is_refused(tmp_path):
    old, _, manifest, prefix = _embed_only(tmp_path)
    positions, values = _gaps([4, 5]), _values(2)  # positions 3 and 8, not 3 and 7
    patch = _forged(prefix, [["embed", "delta2", 2, len(positions), len(values)]], positions, values)
    with pytest.raises(PatchError, match="does not match its signed hash"):
        rebuild(tmp_path, patch, old, manifest)
    assert not list((tmp_path / "out").iterdir())


def test_a_patch_over_a_parent_lacking_the_tensor_is_refused(tmp_path):
    _, _, manifest, prefix = _embed_only(tmp_path)
    other = write_version(tmp_path / "other", {"unrelated": torch.zeros(4)})
    positions, values = _gaps([4, 4]), _values(2)
    patch = _forged(prefix, [["embed", "delta2", 2, len(positions), len(values)]], positions, values)
    with pytest.raises(PatchError, match="parent tensor that is missing"):
        rebuild(tmp_path, patch, other, manifest)


@pytest.mark.parametrize("mangle, why", [
    (lambda p: b"NOTPATCH" + p[8:], "magic"),
    (lambda p: p[:12] + b"\xc1" * 8, "not valid msgpack|larger than allowed"),
    (lambda p: p + b"x", "payload bytes"),
    (lambda p: p[:-1], "payload bytes"),
    (lambda p: MAGIC + (1 << 30).to_bytes(4, "little"), "larger than allowed"),
])
def test_malformed_patches_are_refused_in_one_line(tmp_path, mangle, why):
    old, _, manifest, prefix = _embed_only(tmp_path)
    positions, values = _gaps([4, 4]), _values(2)
    patch = _forged(prefix, [["embed", "delta2", 2, len(positions), len(values)]], positions, values)
    with pytest.raises(PatchError, match=why):
        rebuild(tmp_path, mangle(patch), old, manifest)


def test_a_patch_laying_out_tensors_otherwise_than_its_manifest_is_refused(tmp_path):
    parent, child, old, new = parent_and_child(tmp_path)
    files, start = decode_head((new / "model.patch").read_bytes())
    head = msgpack.unpackb((new / "model.patch").read_bytes()[12:start])
    head["files"][0]["name"] = "other.safetensors"
    patch = encode_head(head["files"]) + (new / "model.patch").read_bytes()[start:]
    with pytest.raises(PatchError, match="other files than its manifest"):
        rebuild(tmp_path, patch, old, child)


def test_check_blocks_decodes_every_block_of_a_real_patch(tmp_path):
    _, _, _, new = parent_and_child(tmp_path)
    assert check_blocks((new / "model.patch").read_bytes()) > 0


@pytest.mark.parametrize("mutate, why", [
    (lambda d: d["patch"].update(parent_version=2), "patch parent version"),  # itself: a cycle
    (lambda d: d["patch"].update(parent_version=3), "patch parent version"),  # a parent newer than its child
    (lambda d: d["patch"].update(parent_id=b"x" * 31), "patch parent id"),
    (lambda d: d["patch"].update(file="model.safetensors"), "patch file"),  # the weights as their own patch
    (lambda d: d["patch"].update(file="absent.patch"), "patch file"),
    (lambda d: d["patch"].update(extra=1), "patch reference"),
    (lambda d: d["tensors"][0].update(hash=b"short"), "tensor hash"),
])
def test_manifests_with_malformed_patch_references_are_refused(tmp_path, mutate, why):
    from p2p.errors import ManifestError
    from p2p.pieces.manifest import decode_manifest

    _, child, _, _ = parent_and_child(tmp_path)
    raw = msgpack.unpackb(child.encode())
    mutate(raw)
    with pytest.raises(ManifestError, match=why):
        decode_manifest(msgpack.packb(raw, use_bin_type=True))


def test_a_patch_names_one_parent_and_no_chain_so_an_old_parent_costs_one_full_copy(tmp_path):
    """A version 10,000 versions after the parent its patch names: a peer that does not follow that exact parent
    fetches the version's full files, never a chain."""
    from p2p.pieces.manifest import PatchRef
    from swarm.policy.patch_form import form_flags, patch_parent

    parent, child, _, new = parent_and_child(tmp_path)
    far = manifest_of(new, 10_002, PatchRef(parent.id, 2, "model.patch"))
    assert patch_parent(far, {}) is None
    flags = form_flags(far, patch_form=False)
    fetched = sum(ref.length for ref, wanted in zip(far.pieces, flags) if wanted)
    assert fetched == far.full_size() == (new / "model.safetensors").stat().st_size
