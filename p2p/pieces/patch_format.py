"""The policy patch format: what changed in each tensor from one version to the next, bit for bit.

Layout of a patch file (one per version, covering every safetensors file of the version):

    b"RLSPATCH"  u32 little-endian head length  head (msgpack)  payload

    head = {"v": 1, "files": [{"name": str, "header": bytes, "tensors": [[name, encoding, changed, a, b], ...]}]}

`header` is the new file's safetensors prefix verbatim (8-byte length and JSON), so the rebuilt file is byte for
byte the trainer's. Tensors are listed in the order of their data in that file; each takes `a + b` payload bytes,
in order: `a` bytes of compressed positions, then `b` bytes of compressed values. Encodings:

    same    unchanged: copied from the parent's tensor of the same name (a = b = 0)
    full    every byte anew (a = 0): a new tensor, or one whose dtype or shape changed
    mask    positions as a bitmask over the elements (np.packbits, little bit order), then the changed elements
    delta1, delta2, delta4
            positions as the first index then the gaps to each next one, in 1-, 2- or 4-byte unsigned integers,
            then the changed elements

Positions count elements (2 bytes each in bf16), not bytes. A changed element's new bytes travel XORed with the
parent's bytes of that element (`full` tensors travel as they are), byte-shuffled (every element's first byte, then
every second byte...): an update of a few units in the last place leaves the sign-and-exponent byte's XOR zero, so
it compresses to almost nothing (a third of the values' bytes against the new bytes as they are, on SmolLM2). Each
block is one zstd frame. XOR is a bitwise transform of the bytes, never a float difference, so applying a patch is
exact whatever the arithmetic of the machine.

Limits before decoding: the head is at most MAX_HEAD_BYTES and decodes into at most MAX_FILES files of MAX_TENSORS
tensors; every block's inflated size is known from the header of the tensor it rebuilds, and inflation stops one
byte past it.
"""

from __future__ import annotations

import io
import json
import re
from dataclasses import dataclass
from typing import TypeVar

import msgpack
import numpy as np
import zstandard

from p2p.errors import PatchError

MAGIC = b"RLSPATCH"
FORMAT = 1
MAX_HEAD_BYTES = 16 << 20
MAX_FILES = 1024
MAX_TENSORS = 1 << 17
MAX_HEADER_BYTES = 100 << 20
READ_CHUNK = 16 << 20
"""Bytes inflated per read: the output buffer of one read is this size, whatever a block claims."""
SAFE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
ENCODINGS = ("same", "full", "mask", "delta1", "delta2", "delta4")
DELTA_WIDTHS = {"delta1": 1, "delta2": 2, "delta4": 4}
DTYPE_SIZES = {"BOOL": 1, "U8": 1, "I8": 1, "F8_E5M2": 1, "F8_E4M3": 1, "I16": 2, "U16": 2, "F16": 2, "BF16": 2,
               "I32": 4, "U32": 4, "F32": 4, "I64": 8, "U64": 8, "F64": 8}


@dataclass(frozen=True)
class TensorLayout:
    """Where one tensor's data lies in its safetensors file, read from the file's header."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    start: int  # absolute offset of its first byte in the file
    nbytes: int

    @property
    def itemsize(self) -> int:
        return DTYPE_SIZES[self.dtype]

    @property
    def elements(self) -> int:
        return self.nbytes // self.itemsize


@dataclass(frozen=True)
class TensorPatch:
    """One tensor's entry in a patch: how it is rebuilt, and its payload's two block lengths."""

    name: str
    encoding: str
    changed: int
    positions_len: int
    values_len: int


@dataclass(frozen=True)
class FilePatch:
    """One rebuilt safetensors file: its header verbatim, its tensors in data order, their payloads' offset."""

    name: str
    header: bytes
    layout: tuple[TensorLayout, ...]
    tensors: tuple[TensorPatch, ...]

    @property
    def size(self) -> int:
        return max((t.start + t.nbytes for t in self.layout), default=len(self.header))


def parse_header(prefix: bytes, what: str) -> tuple[TensorLayout, ...]:
    """The tensors of a safetensors prefix (8-byte length + JSON), in data order, checked to tile the data region
    with no gap or overlap, so a rebuilt file is exactly header then tensors."""
    if len(prefix) < 8:
        raise PatchError(f"{what}: the safetensors header is cut short")
    length = int.from_bytes(prefix[:8], "little")
    if length > MAX_HEADER_BYTES or len(prefix) != 8 + length:
        raise PatchError(f"{what}: the safetensors header length does not match its bytes")
    try:
        meta = json.loads(prefix[8:])
    except (ValueError, UnicodeDecodeError, RecursionError):
        raise PatchError(f"{what}: the safetensors header is not JSON (or nests too deep)") from None
    if not isinstance(meta, dict):
        raise PatchError(f"{what}: the safetensors header is not a JSON object")
    layout = [_tensor_layout(name, entry, 8 + length, what) for name, entry in meta.items() if name != "__metadata__"]
    layout.sort(key=lambda t: t.start)
    end = 8 + length
    for t in layout:
        if t.start != end:
            raise PatchError(f"{what}: tensor {t.name!r} does not follow the previous one's data")
        end += t.nbytes
    return tuple(layout)


def _tensor_layout(name: object, entry: object, base: int, what: str) -> TensorLayout:
    if not (isinstance(name, str) and isinstance(entry, dict)):
        raise PatchError(f"{what}: a tensor entry of the safetensors header is malformed")
    dtype, shape, offsets = entry.get("dtype"), entry.get("shape"), entry.get("data_offsets")
    if dtype not in DTYPE_SIZES:
        raise PatchError(f"{what}: tensor {name!r} has dtype {dtype!r}, which patches do not know")
    if not (isinstance(shape, list) and len(shape) <= 32 and all(type(d) is int and 0 <= d < 1 << 48 for d in shape)):
        raise PatchError(f"{what}: tensor {name!r} has a malformed shape")
    if not (isinstance(offsets, list) and len(offsets) == 2 and all(type(o) is int and o >= 0 for o in offsets)):
        raise PatchError(f"{what}: tensor {name!r} has malformed data offsets")
    elements = int(np.prod(shape, dtype=object)) if shape else 1
    nbytes = offsets[1] - offsets[0]
    if nbytes != elements * DTYPE_SIZES[dtype]:
        raise PatchError(f"{what}: tensor {name!r} holds {nbytes} bytes, its shape and dtype say otherwise")
    return TensorLayout(name, dtype, tuple(shape), base + offsets[0], nbytes)


# ---------------------------------------------------------------------------------------------- blocks


def compress(data: bytes | memoryview, level: int) -> bytes:
    return zstandard.ZstdCompressor(level=level).compress(data) if len(data) else b""


def inflate(block: bytes | memoryview, expected: int, what: str) -> bytearray:
    """A block inflated to exactly `expected` bytes, into one buffer of that size (plus one byte); inflation stops
    there, so a block that claims or holds more costs no more memory than its tensor."""
    if expected == 0:
        if len(block):
            raise PatchError(f"{what}: an empty block carries bytes")
        return bytearray()
    out = bytearray(expected + 1)
    view, filled = memoryview(out), 0
    try:
        with zstandard.ZstdDecompressor().stream_reader(io.BytesIO(block), read_across_frames=False) as reader:
            while filled <= expected:
                got = reader.readinto(view[filled: min(expected + 1, filled + READ_CHUNK)])
                if not got:
                    break
                filled += got
    except zstandard.ZstdError:
        raise PatchError(f"{what}: a block is not valid zstd") from None
    finally:
        view.release()
    if filled != expected:
        raise PatchError(f"{what}: a block inflates to {'more' if filled > expected else 'fewer'} bytes than its "
                         "tensor holds")
    del out[expected:]
    return out


def shuffle(values: np.ndarray) -> bytes:
    """Elements [n, itemsize] as bytes grouped by position within the element."""
    return np.ascontiguousarray(values.T).tobytes()


def unshuffle(data: bytes | bytearray, itemsize: int) -> np.ndarray:
    """Shuffled bytes as elements [n, itemsize] (a strided view: no copy)."""
    return np.frombuffer(data, dtype=np.uint8).reshape(itemsize, -1).T


def planes(data: bytes | bytearray, itemsize: int) -> np.ndarray:
    """Shuffled bytes as [itemsize, n]: each row one byte of every element, contiguous."""
    return np.frombuffer(data, dtype=np.uint8).reshape(itemsize, -1)


# ---------------------------------------------------------------------------------------------- head


Container = TypeVar("Container", dict, list)
"""What msgpack hands a list_hook (a list) or an object_hook (a dict)."""


class _ContainerBudget:
    """A msgpack hook that stops decoding past one container per 8 bytes of head: a real head holds a few per
    tensor, and a head of nested empty arrays would otherwise decode into far more memory than its bytes."""

    def __init__(self, length: int) -> None:
        self.left = 64 + length // 8

    def __call__(self, obj: Container) -> Container:
        self.left -= 1
        if self.left < 0:
            raise PatchError("policy patch head holds more maps and arrays than its size allows")
        return obj


def encode_head(files: list[dict]) -> bytes:
    head = msgpack.packb({"v": FORMAT, "files": files}, use_bin_type=True)
    return MAGIC + len(head).to_bytes(4, "little") + head


def decode_head(data: bytes | memoryview) -> tuple[tuple[FilePatch, ...], int]:
    """The files a patch rebuilds and where its payload starts; PatchError for anything else."""
    if len(data) < len(MAGIC) + 4 or bytes(data[: len(MAGIC)]) != MAGIC:
        raise PatchError("policy patch does not start with the patch magic")
    length = int.from_bytes(data[len(MAGIC): len(MAGIC) + 4], "little")
    start = len(MAGIC) + 4
    if length > MAX_HEAD_BYTES or start + length > len(data):
        raise PatchError("policy patch head is larger than allowed or than the patch")
    budget = _ContainerBudget(length)
    try:
        raw = msgpack.unpackb(bytes(data[start: start + length]), raw=False, strict_map_key=True,
                              max_array_len=MAX_TENSORS, max_map_len=8, max_bin_len=MAX_HEADER_BYTES + 8,
                              max_str_len=4096, list_hook=budget, object_hook=budget)
    except PatchError:
        raise
    except Exception:  # noqa: BLE001 - msgpack raises many types on hostile bytes; all mean "not a patch"
        raise PatchError("policy patch head is not valid msgpack") from None
    if not (isinstance(raw, dict) and set(raw) == {"v", "files"} and raw["v"] == FORMAT):
        raise PatchError("policy patch head has the wrong fields or format")
    files = raw["files"]
    if not (isinstance(files, list) and 0 < len(files) <= MAX_FILES):
        raise PatchError("policy patch names no files or too many")
    decoded = tuple(_decode_file(f) for f in files)
    if len({f.name for f in decoded}) != len(decoded):
        raise PatchError("policy patch names a file twice")
    return decoded, start + length


def _decode_file(raw: object) -> FilePatch:
    if not (isinstance(raw, dict) and set(raw) == {"name", "header", "tensors"}):
        raise PatchError("policy patch has a malformed file entry")
    name, header, tensors = raw["name"], raw["header"], raw["tensors"]
    if not (isinstance(name, str) and isinstance(header, bytes) and isinstance(tensors, list)):
        raise PatchError("policy patch has a file entry of the wrong types")
    if not (SAFE_NAME.match(name) and name.endswith(".safetensors")):
        raise PatchError(f"policy patch names a file {name[:80]!r} that is not a bare safetensors file name")
    layout = parse_header(header, f"patch of {name!r}")
    if len(tensors) != len(layout):
        raise PatchError(f"patch of {name!r} lists {len(tensors)} tensors, its header {len(layout)}")
    entries = tuple(_decode_tensor(t, spot) for t, spot in zip(tensors, layout))
    return FilePatch(name, header, layout, entries)


def _decode_tensor(raw: object, spot: TensorLayout) -> TensorPatch:
    if not (isinstance(raw, list) and len(raw) == 5):
        raise PatchError(f"patch entry of tensor {spot.name!r} is malformed")
    name, encoding, changed, a, b = raw
    if name != spot.name or encoding not in ENCODINGS:
        raise PatchError(f"patch entry of tensor {spot.name!r} names another tensor or an unknown encoding")
    if not all(type(v) is int and 0 <= v <= 1 << 48 for v in (changed, a, b)) or changed > spot.elements:
        raise PatchError(f"patch entry of tensor {spot.name!r} has counts out of range")
    if encoding == "same" and (changed or a or b) or encoding == "full" and a:
        raise PatchError(f"patch entry of tensor {spot.name!r} carries blocks its encoding has no use for")
    return TensorPatch(name, encoding, changed, a, b)
