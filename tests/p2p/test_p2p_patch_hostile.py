"""Hostile patches (signed by a buggy or hostile trainer key, or fed to the fuzz harness): applying or decoding one
must write nothing outside its scratch directory and must fail only with PatchError."""

from __future__ import annotations

import json

import msgpack
import pytest

from p2p.errors import PatchError
from p2p.pieces.patch import apply_patch, check_blocks
from p2p.pieces.patch_format import MAGIC, decode_head
from swarm.policy.patch_form import expected_tensors
from tests.patch_versions import parent_and_child


def _with_extra_file(patch: bytes, name: str, first: bool = True) -> bytes:
    """The patch with one more file entry that holds no tensor (a safetensors header of metadata only)."""
    length = int.from_bytes(patch[8:12], "little")
    head = msgpack.unpackb(patch[12:12 + length], raw=False)
    meta = json.dumps({"__metadata__": {"k": "v"}}).encode()
    entry = {"name": name, "header": len(meta).to_bytes(8, "little") + meta, "tensors": []}
    head["files"] = [entry] + head["files"] if first else head["files"] + [entry]
    packed = msgpack.packb(head, use_bin_type=True)
    return MAGIC + len(packed).to_bytes(4, "little") + packed + patch[12 + length:]


def test_a_patch_cannot_write_a_file_outside_its_rebuild_directory(tmp_path):
    parent, child, old, new = parent_and_child(tmp_path)
    # its temporary name would resolve there too
    hostile = _with_extra_file((new / "model.patch").read_bytes(), "./../../../escaped")
    out = tmp_path / "store" / "rebuild" / "abc"
    out.mkdir(parents=True)
    try:
        apply_patch(hostile, [old / "model.safetensors"], out, expected_tensors(child))
    except PatchError:
        pass
    assert not (tmp_path / "escaped").exists(), "the patch wrote a file three directories above its scratch dir"


def test_a_patch_naming_a_file_its_manifest_lacks_is_refused(tmp_path):
    """A tensor-less file entry is never compared with the manifest, so apply_patch returns a path that
    check_rebuilt then cannot find (StopIteration in the rebuild thread)."""
    parent, child, old, new = parent_and_child(tmp_path)
    hostile = _with_extra_file((new / "model.patch").read_bytes(), "extra.bin", first=False)
    out = tmp_path / "out"
    out.mkdir()
    with pytest.raises(PatchError):
        apply_patch(hostile, [old / "model.safetensors"], out, expected_tensors(child))


def test_a_deeply_nested_safetensors_header_is_a_patch_error():
    nested = b"[" * 200_000 + b"]" * 200_000
    packed = msgpack.packb({"v": 1, "files": [{"name": "model.safetensors",
                                                "header": len(nested).to_bytes(8, "little") + nested,
                                                "tensors": []}]}, use_bin_type=True)
    patch = MAGIC + len(packed).to_bytes(4, "little") + packed
    with pytest.raises(PatchError):
        decode_head(patch)
    with pytest.raises(PatchError):
        check_blocks(patch)
