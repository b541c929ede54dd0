"""Policy patches: a version as the bytes that changed since its parent, rebuilt bit for bit (format: patch_format).

Why: the published policy is in its inference dtype (bf16 by default), where an element's bytes change only when its
update exceeds about |w|/256; with RL's small learning rates most elements keep their bytes from one step to the
next, so the changed positions and their new bytes are a small fraction of a full copy. Nothing is a float
difference: a rebuilt tensor is compared by BLAKE3 with the hash its signed manifest names before it is kept.

Encoding reads both versions one tensor at a time; applying reads the parent one tensor at a time, patches it in
place and writes the new files through a temporary name, so memory stays near the largest tensor (its bytes, its
changed positions as int32 and their new bytes) while the patch itself can be a memory map.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import blake3
import numpy as np

from p2p.errors import PatchError
from p2p.pieces.patch_format import (
    DELTA_WIDTHS,
    MAX_HEADER_BYTES,
    FilePatch,
    TensorLayout,
    TensorPatch,
    compress,
    decode_head,
    encode_head,
    inflate,
    parse_header,
    planes,
    shuffle,
    unshuffle,
)

_UINT = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}
FULL_ABOVE = 0.5
"""A tensor with more than this share of its elements changed travels whole: its positions would cost more than
they save."""


@dataclass(frozen=True)
class PatchStats:
    """What an encoded patch holds: elements changed of all, and tensors sent whole."""

    elements: int
    changed: int
    full_tensors: int
    bytes: int


def read_prefix(path: Path) -> bytes:
    """A safetensors file's header prefix (8-byte length + JSON), read without the data."""
    with open(path, "rb") as fh:
        raw = fh.read(8)
        length = int.from_bytes(raw, "little") if len(raw) == 8 else -1
        if not 0 <= length <= MAX_HEADER_BYTES:
            raise PatchError(f"{path.name} is not a safetensors file")
        return raw + fh.read(length)


def tensor_index(paths: list[Path]) -> dict[str, tuple[Path, TensorLayout]]:
    """Every tensor of a version's safetensors files by name."""
    out: dict[str, tuple[Path, TensorLayout]] = {}
    for path in paths:
        for spot in parse_header(read_prefix(path), path.name):
            out[spot.name] = (path, spot)
    return out


def _read(path: Path, spot: TensorLayout) -> bytes:
    with open(path, "rb", buffering=0) as fh:
        data = os.pread(fh.fileno(), spot.nbytes, spot.start)
    if len(data) != spot.nbytes:
        raise PatchError(f"{path.name} ends inside tensor {spot.name!r}")
    return data


def _read_into(path: Path, spot: TensorLayout) -> bytearray:
    """A tensor's bytes in a buffer of its own, to be patched in place (one copy of the tensor)."""
    data = bytearray(spot.nbytes)
    with open(path, "rb", buffering=0) as fh:
        fh.seek(spot.start)
        if fh.readinto(data) != spot.nbytes:
            raise PatchError(f"{path.name} ends inside tensor {spot.name!r}")
    return data


def _same_kind(a: TensorLayout, b: TensorLayout) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape


# ---------------------------------------------------------------------------------------------- encoding


def encode_tensor(old: bytes | None, new: bytes, itemsize: int, level: int) -> tuple[str, int, bytes, bytes]:
    """(encoding, changed elements, positions block, values block) of one tensor."""
    width = _UINT[itemsize]
    fresh = np.frombuffer(new, dtype=np.uint8).reshape(-1, itemsize)
    if old is None:
        return "full", len(fresh), b"", compress(shuffle(fresh), level)
    changed = np.flatnonzero(np.frombuffer(old, dtype=width) != np.frombuffer(new, dtype=width))
    if changed.size == 0:
        return "same", 0, b"", b""
    if changed.size > FULL_ABOVE * len(fresh):
        return "full", len(fresh), b"", compress(shuffle(fresh), level)
    encoding, positions = _smaller_positions(changed, len(fresh), level)
    flipped = fresh[changed] ^ np.frombuffer(old, dtype=np.uint8).reshape(-1, itemsize)[changed]
    return encoding, int(changed.size), positions, compress(shuffle(flipped), level)


def _smaller_positions(changed: np.ndarray, elements: int, level: int) -> tuple[str, bytes]:
    """The changed positions as a bitmask or as gaps, whichever compresses smaller."""
    flags = np.zeros(elements, dtype=np.uint8)
    flags[changed] = 1
    mask = compress(np.packbits(flags, bitorder="little").tobytes(), level)
    gaps = np.diff(changed, prepend=-1)
    top = int(gaps.max())
    name = next(n for n, w in DELTA_WIDTHS.items() if top < 1 << (8 * w))
    delta = compress(gaps.astype(f"<u{DELTA_WIDTHS[name]}").tobytes(), level)
    return ("mask", mask) if len(mask) <= len(delta) else (name, delta)


def encode_patch(parent_files: list[Path], child_files: list[Path], out: Path, level: int = 3) -> PatchStats:
    """Write the patch that rebuilds `child_files` from `parent_files` to `out`; returns what it holds."""
    parent = tensor_index(parent_files)
    files, blocks = [], []
    elements = changed = full = 0
    for path in child_files:
        prefix = read_prefix(path)
        entries = []
        for spot in parse_header(prefix, path.name):
            new = _read(path, spot)
            source = parent.get(spot.name)
            old = _read(*source) if source is not None and _same_kind(source[1], spot) else None
            encoding, count, positions, values = encode_tensor(old, new, spot.itemsize, level)
            entries.append([spot.name, encoding, count, len(positions), len(values)])
            blocks += [positions, values]
            elements += spot.elements
            changed += count
            full += encoding == "full"
        files.append({"name": path.name, "header": prefix, "tensors": entries})
    tmp = out.with_name(f".{out.name}.tmp")
    with open(tmp, "wb") as fh:
        fh.write(encode_head(files))
        for block in blocks:
            fh.write(block)
    os.replace(tmp, out)
    return PatchStats(elements, changed, full, out.stat().st_size)


# ---------------------------------------------------------------------------------------------- applying


def apply_patch(patch: bytes | memoryview, parent_files: list[Path], out_dir: Path,
                expected: Mapping[str, tuple[str, TensorLayout, bytes]]) -> list[Path]:
    """Rebuild a version's safetensors files in `out_dir` from its parent's and the patch.

    expected: tensor name -> (file name, layout, BLAKE3 of its bytes), as the version's signed manifest names
    them. Every rebuilt tensor must hash to its entry and every file must lay its tensors out as the manifest
    says, or PatchError is raised and nothing is left in `out_dir`."""
    files, blocks = split_blocks(patch)
    _check_against(files, expected)
    parent = tensor_index(parent_files)
    written: list[Path] = []
    try:
        for file, file_blocks in zip(files, blocks):
            _rebuild_file(file, file_blocks, parent, out_dir, expected)
            written.append(out_dir / file.name)
    except BaseException:
        for path in written:
            path.unlink(missing_ok=True)
        raise
    return written


Blocks = list[tuple[memoryview, memoryview]]
"""Each tensor's (positions, values) blocks of one file, in the order of its tensors."""


def split_blocks(patch: bytes | memoryview) -> tuple[tuple[FilePatch, ...], list[Blocks]]:
    """The files a patch rebuilds and, per file, each tensor's two payload blocks (views, no copy); PatchError unless
    the payload is exactly as long as the head declares."""
    files, start = decode_head(patch)
    payload = memoryview(patch)[start:]
    declared = sum(t.positions_len + t.values_len for f in files for t in f.tensors)
    if declared != len(payload):
        raise PatchError(f"policy patch declares {declared} payload bytes and carries {len(payload)}")
    blocks, at = [], 0
    for file in files:
        blocks.append([])
        for entry in file.tensors:
            middle, end = at + entry.positions_len, at + entry.positions_len + entry.values_len
            blocks[-1].append((payload[at:middle], payload[middle:end]))
            at = end
    return files, blocks


def _check_against(files: tuple[FilePatch, ...], expected: Mapping[str, tuple[str, TensorLayout, bytes]]) -> None:
    """The patch must rebuild exactly the files and tensors the manifest names, where it names them."""
    if {f.name for f in files} != {want[0] for want in expected.values()}:
        raise PatchError("policy patch rebuilds other files than its manifest's weight files")
    seen = 0
    for file in files:
        for spot in file.layout:
            want = expected.get(spot.name)
            if want is None or want[0] != file.name or want[1] != spot:
                raise PatchError(f"policy patch lays out tensor {spot.name!r} otherwise than its manifest")
            seen += 1
    if seen != len(expected):
        raise PatchError("policy patch leaves out tensors its manifest names")


def _rebuild_file(file: FilePatch, blocks: Blocks, parent: dict, out_dir: Path,
                  expected: Mapping[str, tuple[str, TensorLayout, bytes]]) -> None:
    dest = out_dir / file.name
    tmp = out_dir / f".{file.name}.tmp"
    if dest.parent != out_dir:  # decode_head admits bare names only; kept here since a path is about to be written
        raise PatchError(f"policy patch names a file outside its directory: {file.name!r}")
    try:
        with open(tmp, "wb") as fh:
            fh.write(file.header)
            for entry, spot, (positions, values) in zip(file.tensors, file.layout, blocks):
                data = rebuild_tensor(entry, spot, positions, values, parent)
                if blake3.blake3(data).digest() != expected[spot.name][2]:
                    raise PatchError(f"tensor {spot.name!r} rebuilt from the patch does not match its signed hash")
                fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, dest)
    finally:
        tmp.unlink(missing_ok=True)


def rebuild_tensor(entry: TensorPatch, spot: TensorLayout, positions: memoryview, values: memoryview,
                   parent: Mapping[str, tuple[Path, TensorLayout]]) -> bytes:
    """One tensor's new bytes from its patch entry and the parent's tensor of the same name."""
    what = f"tensor {spot.name!r} of the patch"
    if entry.encoding == "full":
        if entry.changed != spot.elements:
            raise PatchError(f"{what} is sent whole but counts {entry.changed} of {spot.elements} elements")
        return unshuffle(inflate(values, spot.nbytes, what), spot.itemsize).tobytes()
    source = parent.get(spot.name)
    if source is None or not _same_kind(source[1], spot):
        raise PatchError(f"{what} patches a parent tensor that is missing or of another dtype or shape")
    data = _read_into(*source)
    if entry.encoding == "same":
        return data
    index = decode_positions(entry, spot, positions)
    elements = np.frombuffer(data, dtype=np.uint8).reshape(-1, spot.itemsize)
    for byte, plane in enumerate(planes(inflate(values, entry.changed * spot.itemsize, what), spot.itemsize)):
        column = elements[:, byte]  # a view: one byte of every element
        column[index] ^= plane  # a plain boolean or integer selector, so numpy builds no array of positions
    return data


def _index_type(elements: int) -> type:
    """int32 positions while they fit: half the memory of int64 for the tensors of real models."""
    return np.int32 if elements < 1 << 31 else np.int64


def check_blocks(patch: bytes) -> int:
    """Decode a patch's head and every block it carries, without a parent (what `swarm bench fuzz` drives); returns
    the changed elements it counts. Raises PatchError for anything apply_patch would refuse before reading a parent."""
    files, blocks = split_blocks(patch)
    changed = 0
    for file, file_blocks in zip(files, blocks):
        for entry, spot, (positions, values) in zip(file.tensors, file.layout, file_blocks):
            if entry.encoding == "full":
                inflate(values, spot.nbytes, spot.name)
            elif entry.encoding != "same":
                decode_positions(entry, spot, positions)
                inflate(values, entry.changed * spot.itemsize, spot.name)
            changed += entry.changed
    return changed


def decode_positions(entry: TensorPatch, spot: TensorLayout, block: memoryview) -> np.ndarray:
    """The changed elements, checked to be in range, sorted, distinct and as many as counted: a boolean selector
    over the elements for a bitmask, their positions for gaps."""
    what = f"tensor {spot.name!r} of the patch"
    if entry.changed == 0:
        raise PatchError(f"{what} is marked changed but counts no changed element")
    if entry.encoding == "mask":
        raw = np.frombuffer(inflate(block, -(-spot.elements // 8), what), dtype=np.uint8)
        flags = np.unpackbits(raw, bitorder="little").view(bool)
        if flags[spot.elements:].any():
            raise PatchError(f"{what} flags positions past the tensor's end")
        flags = flags[: spot.elements]  # a boolean selector: no array of positions is built
        if int(np.count_nonzero(flags)) != entry.changed:
            raise PatchError(f"{what} flags {int(np.count_nonzero(flags))} positions and counts {entry.changed}")
        return flags
    else:
        width = DELTA_WIDTHS[entry.encoding]
        gaps = np.frombuffer(inflate(block, entry.changed * width, what), dtype=f"<u{width}")
        if (gaps < 1).any():
            raise PatchError(f"{what} lists positions out of order or twice")
        if int(gaps.sum(dtype=np.uint64)) > spot.elements:  # checked before the running sum, which cannot overflow
            raise PatchError(f"{what} lists a position past the tensor's end")
        index = np.cumsum(gaps, dtype=_index_type(spot.elements + 1)) - 1
        if index[-1] >= spot.elements:
            raise PatchError(f"{what} lists a position past the tensor's end")
    if index.size != entry.changed:
        raise PatchError(f"{what} flags {index.size} positions and counts {entry.changed}")
    return index
