"""The one decoder of policy manifests: every manifest from the network or the disk becomes a value here, or a
ManifestError.

Rules: sizes are checked before a byte is decoded; msgpack builds at most one container per 8 input bytes; every
field, down to each tensor entry and each value of the model description, is checked for its type and range before
a PolicyManifest exists, whose model description is then read-only (FrozenMap); and nothing but ManifestError
leaves this module. Why so strict: with trust on first use a
peer adopts the key of the first manifest it sees, so a stranger's self-signed manifest reaches this decoder on
every path (gossip announcement, the manifest protocol, a data channel preamble, `swarm status`), and an error of
any other type would end whichever role or command catches only ManifestError.
"""

from __future__ import annotations

import math
import re

import blake3
import msgpack

from p2p.errors import ManifestError
from p2p.packed import Packed
from p2p.pieces.manifest_types import (
    FORMAT_VERSION,
    MAX_MANIFEST_BYTES,
    MAX_PIECE_SIZE,
    MIN_PIECE_SIZE,
    FileEntry,
    GenerationSettings,
    PatchRef,
    PolicyManifest,
    SignedManifest,
    TensorEntry,
    freeze,
    is_safe_file_name,
)

MAX_SIGNED_BYTES = MAX_MANIFEST_BYTES + 1024
MAX_RUN_CHARS = 200
MAX_TENSOR_NAME_CHARS = 1024
MAX_DIMS = 32
MAX_MODEL_DEPTH = 32
"""Deepest nesting of maps and lists in the model description (a real config nests three or four levels)."""
MAX_INT = (1 << 63) - 1
"""Largest version, size, offset or dimension: what a signed 64-bit integer holds everywhere else in the stack."""
MAX_TEMPERATURE = 10.0
"""Highest sampling temperature a manifest may set: the range every rollout and generation request accepts."""
GENERATION_LIMITS = {"group_size": (1, 1 << 16), "max_new_tokens": (1, 1 << 24), "stage": (0, 1 << 16)}
_DTYPE = re.compile(r"^[A-Za-z0-9_]{1,16}$")
_TOP_KEYS = frozenset({"format", "run", "version", "parent_version", "created_at", "model", "generation", "tensors",
                       "files", "patch"})
_FILE_KEYS = frozenset({"name", "size", "piece_size", "piece_hashes", "root"})
_TENSOR_KEYS = frozenset({"name", "file", "offset", "nbytes", "dtype", "shape", "hash"})
_PATCH_KEYS = frozenset({"parent_id", "parent_version", "file"})
_GENERATION_KEYS = frozenset({"group_size", "temperature", "max_new_tokens", "stage"})


def decode_signed(signed_bytes: bytes) -> SignedManifest:
    """Parse the outer signed envelope (size and field checks only; no signature check)."""
    if not isinstance(signed_bytes, (bytes, bytearray)):
        raise ManifestError("a signed policy manifest must be bytes")
    if len(signed_bytes) > MAX_SIGNED_BYTES:
        raise ManifestError(f"policy manifest of {len(signed_bytes)} bytes is larger than allowed")
    try:  # one map of three short keys: nothing else is decoded (a hostile body cannot inflate into Python objects)
        outer = msgpack.unpackb(bytes(signed_bytes), raw=False, max_map_len=3, max_array_len=0, max_str_len=1,
                                max_ext_len=0, max_bin_len=MAX_MANIFEST_BYTES)
    except Exception:  # noqa: BLE001 - msgpack raises many types on hostile bytes; all mean "not a manifest"
        raise ManifestError("policy manifest is not valid msgpack") from None
    if not isinstance(outer, dict) or set(outer) != {"m", "k", "s"}:
        raise ManifestError("signed policy manifest has the wrong fields")
    m, k, s = outer["m"], outer["k"], outer["s"]
    if not (isinstance(m, bytes) and isinstance(k, bytes) and isinstance(s, bytes) and len(k) == 32 and len(s) == 64):
        raise ManifestError("signed policy manifest has fields of the wrong type or size")
    return SignedManifest(m, k, s)


def decode_manifest(data: bytes) -> PolicyManifest:
    """Decode canonical manifest bytes, checking every field; non-canonical encodings are refused."""
    _need(isinstance(data, (bytes, bytearray)), "not bytes")
    _need(len(data) <= MAX_MANIFEST_BYTES, "too large")
    data = bytes(data)
    raw = _unpack(data)
    _need(isinstance(raw, dict) and set(raw) == _TOP_KEYS, "top-level fields")
    _need(type(raw["format"]) is int and raw["format"] == FORMAT_VERSION, "unknown format")
    _need(isinstance(raw["run"], str) and 0 < len(raw["run"]) <= MAX_RUN_CHARS, "run name")
    _need(_is_int(raw["version"]), "version")
    _need(raw["parent_version"] is None or _is_int(raw["parent_version"]), "parent version")
    _need(type(raw["created_at"]) is float and math.isfinite(raw["created_at"]), "created_at")
    _need(isinstance(raw["model"], dict) and _is_plain_tree(raw["model"], MAX_MODEL_DEPTH), "model description")
    _need(isinstance(raw["files"], list) and len(raw["files"]) > 0, "file list")
    files = tuple(_decode_file(f) for f in raw["files"])
    _need(len({f.name for f in files}) == len(files), "duplicate file names")
    sizes = {f.name: f.size for f in files}
    _need(isinstance(raw["tensors"], list), "tensor index")
    tensors = tuple(_decode_tensor(t, sizes) for t in raw["tensors"])
    _need(len({t.name for t in tensors}) == len(tensors), "duplicate tensor names")
    patch = _decode_patch(raw["patch"], raw["version"], files)
    manifest = PolicyManifest(raw["run"], raw["version"], raw["parent_version"], raw["created_at"],
                              freeze(raw["model"]), _decode_generation(raw["generation"]), tensors, files, patch)
    _need(manifest.encode() == data, "not in canonical form")
    return manifest


def _need(cond: bool, what: str) -> None:
    if not cond:
        raise ManifestError(f"policy manifest is malformed: {what}")


def _is_int(v: object, lo: int = 0, hi: int = MAX_INT) -> bool:
    return type(v) is int and lo <= v <= hi


def _unpack(data: bytes) -> Packed:
    try:
        return msgpack.unpackb(data, raw=False, strict_map_key=True, list_hook=(budget := _ContainerBudget(data)),
                               object_hook=budget)
    except ManifestError:
        raise
    except Exception:  # noqa: BLE001 - msgpack raises many types on hostile bytes; all mean "not msgpack"
        raise ManifestError("policy manifest is malformed: not msgpack") from None


def _is_plain_tree(value: object, depth: int) -> bool:
    """Whether `value` is what model.json can hold: str-keyed maps, lists, and finite scalars, nested at most
    `depth` deep (a deeper one exhausted the stack of whoever walked it, and bytes or NaN have no JSON form)."""
    if value is None or type(value) in (bool, int, str):
        return True
    if type(value) is float:
        return math.isfinite(value)
    if depth <= 0:
        return False
    if isinstance(value, list):
        return all(_is_plain_tree(v, depth - 1) for v in value)
    if isinstance(value, dict):
        return all(type(k) is str and _is_plain_tree(v, depth - 1) for k, v in value.items())
    return False


def _decode_generation(raw: Packed) -> GenerationSettings:
    _need(isinstance(raw, dict) and set(raw) == _GENERATION_KEYS, "generation settings")
    _need(all(_is_int(raw[key], lo, hi) for key, (lo, hi) in GENERATION_LIMITS.items()), "generation integers")
    temperature = raw["temperature"]
    _need(type(temperature) in (int, float) and 0 <= temperature <= MAX_TEMPERATURE, "temperature")
    return GenerationSettings(raw["group_size"], float(temperature), raw["max_new_tokens"], raw["stage"])


def _decode_file(raw: Packed) -> FileEntry:
    _need(isinstance(raw, dict) and set(raw) == _FILE_KEYS, "file entry")
    name, size, psize, hashes = raw["name"], raw["size"], raw["piece_size"], raw["piece_hashes"]
    _need(isinstance(name, str) and is_safe_file_name(name), "file name")
    _need(_is_int(size, 1) and _is_int(psize, MIN_PIECE_SIZE, MAX_PIECE_SIZE), "file sizes")
    _need(isinstance(hashes, list) and len(hashes) == -(-size // psize), "piece count")
    _need(all(isinstance(h, bytes) and len(h) == 32 for h in hashes), "piece hashes")
    root = blake3.blake3(b"".join(hashes)).digest()
    _need(raw["root"] == root, f"root hash of {name}")
    return FileEntry(name, size, psize, tuple(hashes), root)


def _decode_tensor(raw: Packed, sizes: dict[str, int]) -> TensorEntry:
    _need(isinstance(raw, dict) and set(raw) == _TENSOR_KEYS, "tensor")
    name, file, offset, nbytes, dtype, shape = (raw[k] for k in ("name", "file", "offset", "nbytes", "dtype", "shape"))
    _need(isinstance(name, str) and 0 < len(name) <= MAX_TENSOR_NAME_CHARS, "tensor name")
    _need(isinstance(dtype, str) and _DTYPE.match(dtype) is not None, "tensor dtype")
    _need(isinstance(file, str) and file in sizes, "tensor file")
    _need(_is_int(offset) and _is_int(nbytes) and offset + nbytes <= sizes[file], "tensor past the end of its file")
    _need(isinstance(shape, list) and len(shape) <= MAX_DIMS and all(_is_int(d) for d in shape), "tensor shape")
    _need(isinstance(raw["hash"], bytes) and len(raw["hash"]) == 32, "tensor hash")
    return TensorEntry(name, file, offset, nbytes, dtype, tuple(shape), raw["hash"])


def _decode_patch(raw: Packed, version: int, files: tuple[FileEntry, ...]) -> PatchRef | None:
    """A patch names an older parent by id and a file of this manifest that is not a weight file; a version is
    rebuilt from one parent only, never from a chain, so no manifest can make a peer walk history."""
    if raw is None:
        return None
    _need(isinstance(raw, dict) and set(raw) == _PATCH_KEYS, "patch reference")
    parent_id, parent_version, name = raw["parent_id"], raw["parent_version"], raw["file"]
    _need(isinstance(parent_id, bytes) and len(parent_id) == 32, "patch parent id")
    _need(_is_int(parent_version) and parent_version < version, "patch parent version")
    _need(isinstance(name, str) and not name.endswith(".safetensors") and any(f.name == name for f in files),
          "patch file")
    return PatchRef(parent_id, parent_version, name)


class _ContainerBudget:
    """A msgpack hook that stops decoding past one map or array per 8 bytes of input.

    Why: an empty array is one byte on the wire and a Python list of about 56 bytes, so 8 MiB of them took 578 MiB
    and 3 s to decode; a real manifest (piece hashes as bytes, a few containers per tensor) stays far below."""

    def __init__(self, data: bytes) -> None:
        self.left = 64 + len(data) // 8

    def __call__(self, obj: Packed) -> Packed:
        self.left -= 1
        if self.left < 0:
            raise ManifestError("policy manifest is malformed: more maps and arrays than its size allows")
        return obj
