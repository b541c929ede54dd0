"""Policy manifests: a policy version as content-addressed pieces, signed by the run's trainer key.

A manifest names every piece of every safetensors file by its BLAKE3 hash, so a peer can verify each piece the
moment it lands (BitTorrent v2 style) instead of one hash over a reassembled file (SHARDCAST). Its id is the BLAKE3
of its canonical msgpack encoding, so the same content always has the same name and any peer can serve it.

Rules: building streams files in piece-sized reads into one reused buffer (a seed of a 1 GB policy stays small);
nothing here reads the wall clock (`created_at` is passed in); decoding treats every byte as hostile and checks
sizes, types, names and hash consistency before a PolicyManifest exists.
"""

from __future__ import annotations

import functools
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import blake3
import msgpack
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from p2p.errors import ManifestError

FORMAT_VERSION = 1
DEFAULT_PIECE_SIZE = 1 << 20
MIN_PIECE_SIZE = 256 * 1024
MAX_PIECE_SIZE = 4 << 20
MAX_MANIFEST_BYTES = 32 << 20  # a 62 GB policy at 1 MiB pieces needs about 2.1 MB of hashes
MAX_SAFETENSORS_HEADER = 100 << 20
MODEL_FILE = "model.json"
SIG_CONTEXT = b"rl-swarm/policy-manifest/v1\x00"  # domain separation: this key also signs gossip envelopes
_SAFE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


@dataclass(frozen=True)
class GenerationSettings:
    """Generation settings in force for this policy version (they travel with the weights)."""

    group_size: int  # completions per prompt (GRPO group)
    temperature: float  # sampling temperature
    max_new_tokens: int  # generation budget per completion (curriculum context length)
    stage: int  # curriculum stage index


@dataclass(frozen=True)
class TensorEntry:
    """Where one tensor lives: absolute byte offset of its data inside `file`."""

    name: str
    file: str
    offset: int
    nbytes: int
    dtype: str
    shape: tuple[int, ...]


@dataclass(frozen=True)
class FileEntry:
    """One file cut into pieces (a safetensors file, or a data file that travels with it); root = BLAKE3 over the
    concatenated piece hashes."""

    name: str
    size: int
    piece_size: int
    piece_hashes: tuple[bytes, ...]
    root: bytes

    def piece_length(self, local_index: int) -> int:
        return min(self.piece_size, self.size - local_index * self.piece_size)


@dataclass(frozen=True)
class PieceRef:
    """One piece in the manifest's global numbering."""

    index: int
    file: FileEntry
    local_index: int
    offset: int  # byte offset in the file
    length: int
    hash: bytes


@dataclass(frozen=True)
class PolicyManifest:
    """An unsigned policy manifest; see SignedManifest for what travels."""

    run: str
    version: int
    parent_version: int | None
    created_at: float
    model: dict
    generation: GenerationSettings
    tensors: tuple[TensorEntry, ...]
    files: tuple[FileEntry, ...]
    pieces: tuple[PieceRef, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        refs, index = [], 0
        for entry in self.files:
            for local, digest in enumerate(entry.piece_hashes):
                off = local * entry.piece_size
                refs.append(PieceRef(index, entry, local, off, entry.piece_length(local), digest))
                index += 1
        object.__setattr__(self, "pieces", tuple(refs))

    @property
    def num_pieces(self) -> int:
        return len(self.pieces)

    @property
    def total_size(self) -> int:
        return sum(f.size for f in self.files)

    def encode(self) -> bytes:
        """Canonical msgpack encoding (sorted keys, lists, float64): the bytes the id is computed over."""
        return msgpack.packb(_canonical(self.to_dict()), use_bin_type=True, use_single_float=False)

    @functools.cached_property
    def id(self) -> bytes:
        """BLAKE3 of the canonical encoding. Computed once: peers look a version up by id on every link, piece and
        status report, and encoding a manifest walks every tensor and piece hash (3 % of `swarm sim`'s loop
        before it was kept)."""
        return blake3.blake3(self.encode()).digest()

    def to_dict(self) -> dict:
        return {
            "format": FORMAT_VERSION,
            "run": self.run,
            "version": self.version,
            "parent_version": self.parent_version,
            "created_at": float(self.created_at),
            "model": self.model,
            "generation": _asdict(self.generation),
            "tensors": [_asdict(t) | {"shape": list(t.shape)} for t in self.tensors],
            "files": [
                {"name": f.name, "size": f.size, "piece_size": f.piece_size,
                 "piece_hashes": list(f.piece_hashes), "root": f.root}
                for f in self.files
            ],
        }


@dataclass(frozen=True)
class SignedManifest:
    """What travels: the canonical manifest bytes, the signer's raw Ed25519 key and its signature over the id."""

    manifest_bytes: bytes
    public_key: bytes
    signature: bytes

    def to_bytes(self) -> bytes:
        return msgpack.packb({"m": self.manifest_bytes, "k": self.public_key, "s": self.signature}, use_bin_type=True)

    @property
    def id(self) -> bytes:
        return blake3.blake3(self.manifest_bytes).digest()


def _asdict(obj: Any) -> dict:
    return {k: getattr(obj, k) for k in obj.__dataclass_fields__}


def _canonical(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _canonical(value[k]) for k in sorted(value)}
    if isinstance(value, (list, tuple)):
        return [_canonical(v) for v in value]
    return value


# ---------------------------------------------------------------------------------------------- building


def piece_hashes(path: Path, piece_size: int) -> tuple[list[bytes], int]:
    """Hash a file piece by piece through one reused buffer; returns (hashes, size)."""
    buf = bytearray(piece_size)
    view = memoryview(buf)
    hashes, size = [], 0
    with open(path, "rb", buffering=0) as fh:
        while True:
            n = fh.readinto(buf)
            if not n:
                break
            while n < piece_size:  # readinto may return short reads before EOF
                more = fh.readinto(view[n:])
                if not more:
                    break
                n += more
            hashes.append(blake3.blake3(view[:n]).digest())
            size += n
            if n < piece_size:
                break
    return hashes, size


def is_safe_file_name(name: str) -> bool:
    """Whether a manifest may carry a file of this name: a bare name (no path), never model.json."""
    return bool(_SAFE_NAME.match(name)) and name != MODEL_FILE


def file_entry(path: Path, piece_size: int) -> FileEntry:
    """A file's manifest entry: its piece hashes and root (BLAKE3 over the concatenated piece hashes)."""
    hashes, size = piece_hashes(path, piece_size)
    return FileEntry(path.name, size, piece_size, tuple(hashes), blake3.blake3(b"".join(hashes)).digest())


def read_safetensors_index(path: Path) -> list[TensorEntry]:
    """Parse a safetensors header (8-byte LE length + JSON) without reading the tensor data."""
    with open(path, "rb") as fh:
        raw_len = fh.read(8)
        if len(raw_len) != 8:
            raise ManifestError(f"{path.name} is not a safetensors file (too short)")
        hlen = int.from_bytes(raw_len, "little")
        if hlen > MAX_SAFETENSORS_HEADER:
            raise ManifestError(f"{path.name} has a safetensors header of {hlen} bytes, more than allowed")
        try:
            header = json.loads(fh.read(hlen))
        except ValueError:
            raise ManifestError(f"{path.name} has a safetensors header that is not JSON") from None
    base = 8 + hlen
    try:
        return [TensorEntry(name, path.name, base + meta["data_offsets"][0],
                            meta["data_offsets"][1] - meta["data_offsets"][0], meta["dtype"], tuple(meta["shape"]))
                for name, meta in sorted(header.items()) if name != "__metadata__"]
    except (AttributeError, KeyError, IndexError, TypeError, ValueError):
        raise ManifestError(f"{path.name} has a safetensors header that does not describe its tensors") from None


def describe_policy_dir(policy_dir: Path | str) -> tuple[dict, list[Path], list[TensorEntry]]:
    """(model description, safetensors paths, tensor index) of a policy directory, read without hashing a byte of
    the weights: what `swarm publish` checks before it starts a peer, and what a manifest is built from."""
    policy_dir = Path(policy_dir)
    model_path = policy_dir / MODEL_FILE
    if not model_path.is_file():
        raise ManifestError(f"{policy_dir} has no {MODEL_FILE} describing the model")
    try:
        model = json.loads(model_path.read_text())
    except (ValueError, UnicodeDecodeError) as exc:
        raise ManifestError(f"{model_path} is not valid JSON ({exc})") from None
    if not isinstance(model, dict):
        raise ManifestError(f"{model_path} must hold a JSON object")
    paths = sorted(policy_dir.glob("*.safetensors"))
    if not paths:
        raise ManifestError(f"{policy_dir} holds no .safetensors files")
    tensors = [entry for path in paths for entry in read_safetensors_index(path)]
    return model, paths, tensors


def build_manifest(
    policy_dir: Path | str,
    *,
    run: str,
    version: int,
    parent_version: int | None,
    created_at: float,
    generation: GenerationSettings,
    piece_size: int = DEFAULT_PIECE_SIZE,
    data_files: tuple[str, ...] = (),
) -> PolicyManifest:
    """Build the manifest of a directory of *.safetensors files plus its model.json description.

    data_files: names of other files in the directory that travel with the weights (the run's task file): pieces
    and a root like the weights', no tensors. Loaders read only *.safetensors, so they never see them.
    """
    policy_dir = Path(policy_dir)
    if not MIN_PIECE_SIZE <= piece_size <= MAX_PIECE_SIZE:
        raise ManifestError(f"piece size {piece_size} is outside {MIN_PIECE_SIZE}..{MAX_PIECE_SIZE} bytes")
    model, paths, tensors = describe_policy_dir(policy_dir)
    files = [file_entry(path, piece_size) for path in paths]
    for name in data_files:
        path = policy_dir / name
        if not is_safe_file_name(name) or path.suffix == ".safetensors" or not path.is_file():
            raise ManifestError(f"data file {name!r} is not a plain file of {policy_dir} with a safe, non-weight name")
        files.append(file_entry(path, piece_size))
    manifest = PolicyManifest(run, version, parent_version, float(created_at), model, generation,
                              tuple(tensors), tuple(files))
    return decode_manifest(manifest.encode())  # one validation path for built and received manifests


# ---------------------------------------------------------------------------------------------- signing


def sign_manifest(manifest: PolicyManifest, sign: Callable[[bytes], bytes], public_key: bytes) -> SignedManifest:
    """Sign the manifest id (with a domain-separation prefix) using the trainer's key."""
    encoded = manifest.encode()
    digest = blake3.blake3(encoded).digest()
    return SignedManifest(encoded, bytes(public_key), sign(SIG_CONTEXT + digest))


def verify_manifest(signed_bytes: bytes, trainer_public_key: bytes) -> PolicyManifest:
    """Decode and verify a signed manifest; only one signed by `trainer_public_key` is ever returned."""
    signed = decode_signed(signed_bytes)
    if signed.public_key != trainer_public_key:
        raise ManifestError("policy manifest is not signed by this run's trainer key")
    try:
        Ed25519PublicKey.from_public_bytes(signed.public_key).verify(signed.signature, SIG_CONTEXT + signed.id)
    except (InvalidSignature, ValueError):
        raise ManifestError("policy manifest signature is invalid") from None
    return decode_manifest(signed.manifest_bytes)


def decode_signed(signed_bytes: bytes) -> SignedManifest:
    """Parse the outer signed envelope (size and field checks only; no signature check)."""
    if len(signed_bytes) > MAX_MANIFEST_BYTES + 1024:
        raise ManifestError(f"policy manifest of {len(signed_bytes)} bytes is larger than allowed")
    try:  # one map of three short keys: nothing else is decoded (a hostile body cannot inflate into Python objects)
        outer = msgpack.unpackb(signed_bytes, raw=False, max_map_len=3, max_array_len=0, max_str_len=1,
                                max_ext_len=0, max_bin_len=MAX_MANIFEST_BYTES)
    except Exception:
        raise ManifestError("policy manifest is not valid msgpack") from None
    if not isinstance(outer, dict) or set(outer) != {"m", "k", "s"}:
        raise ManifestError("signed policy manifest has the wrong fields")
    m, k, s = outer["m"], outer["k"], outer["s"]
    if not (isinstance(m, bytes) and isinstance(k, bytes) and isinstance(s, bytes) and len(k) == 32 and len(s) == 64):
        raise ManifestError("signed policy manifest has fields of the wrong type or size")
    return SignedManifest(m, k, s)


# ---------------------------------------------------------------------------------------------- decoding


def _need(cond: bool, what: str) -> None:
    if not cond:
        raise ManifestError(f"policy manifest is malformed: {what}")


def _is_int(v: Any, lo: int = 0) -> bool:
    return type(v) is int and v >= lo


def _decode_generation(raw: Any) -> GenerationSettings:
    _need(isinstance(raw, dict) and set(raw) == {"group_size", "temperature", "max_new_tokens", "stage"},
          "generation settings")
    _need(_is_int(raw["group_size"], 1) and _is_int(raw["max_new_tokens"], 1) and _is_int(raw["stage"]),
          "generation integers")
    _need(type(raw["temperature"]) in (int, float) and raw["temperature"] >= 0, "temperature")
    return GenerationSettings(raw["group_size"], float(raw["temperature"]), raw["max_new_tokens"], raw["stage"])


def _decode_file(raw: Any) -> FileEntry:
    _need(isinstance(raw, dict) and set(raw) == {"name", "size", "piece_size", "piece_hashes", "root"}, "file entry")
    name, size, psize, hashes = raw["name"], raw["size"], raw["piece_size"], raw["piece_hashes"]
    _need(isinstance(name, str) and is_safe_file_name(name), f"file name {name!r}")
    _need(_is_int(size, 1) and _is_int(psize) and MIN_PIECE_SIZE <= psize <= MAX_PIECE_SIZE, "file sizes")
    _need(isinstance(hashes, list) and len(hashes) == -(-size // psize), "piece count")
    _need(all(isinstance(h, bytes) and len(h) == 32 for h in hashes), "piece hashes")
    root = blake3.blake3(b"".join(hashes)).digest()
    _need(raw["root"] == root, f"root hash of {name}")
    return FileEntry(name, size, psize, tuple(hashes), root)


def _decode_tensor(raw: Any, sizes: dict[str, int]) -> TensorEntry:
    _need(isinstance(raw, dict) and set(raw) == {"name", "file", "offset", "nbytes", "dtype", "shape"}, "tensor")
    _need(isinstance(raw["name"], str) and isinstance(raw["dtype"], str), "tensor name or dtype")
    _need(raw["file"] in sizes and _is_int(raw["offset"]) and _is_int(raw["nbytes"]), "tensor location")
    _need(raw["offset"] + raw["nbytes"] <= sizes[raw["file"]], "tensor past the end of its file")
    _need(isinstance(raw["shape"], list) and all(_is_int(d) for d in raw["shape"]), "tensor shape")
    return TensorEntry(raw["name"], raw["file"], raw["offset"], raw["nbytes"], raw["dtype"], tuple(raw["shape"]))


class _ContainerBudget:
    """A msgpack hook that stops decoding past one map or array per 8 bytes of input.

    Why: an empty array is one byte on the wire and a Python list of about 56 bytes, so 8 MiB of them took 578 MiB
    and 3 s to decode; a real manifest (piece hashes as bytes, a few containers per tensor) stays far below."""

    def __init__(self, data: bytes) -> None:
        self.left = 64 + len(data) // 8

    def __call__(self, obj: Any) -> Any:
        self.left -= 1
        if self.left < 0:
            raise ManifestError("policy manifest is malformed: more maps and arrays than its size allows")
        return obj


def decode_manifest(data: bytes) -> PolicyManifest:
    """Decode canonical manifest bytes, checking every field; non-canonical encodings are refused."""
    _need(len(data) <= MAX_MANIFEST_BYTES, "too large")
    try:
        raw = msgpack.unpackb(data, raw=False, strict_map_key=True, list_hook=(budget := _ContainerBudget(data)),
                              object_hook=budget)
    except ManifestError:
        raise
    except Exception:
        raise ManifestError("policy manifest is malformed: not msgpack") from None
    keys = {"format", "run", "version", "parent_version", "created_at", "model", "generation", "tensors", "files"}
    _need(isinstance(raw, dict) and set(raw) == keys, "top-level fields")
    _need(raw["format"] == FORMAT_VERSION, f"unknown format {raw['format']!r}")
    _need(isinstance(raw["run"], str) and 0 < len(raw["run"]) <= 200, "run name")
    _need(_is_int(raw["version"]), "version")
    _need(raw["parent_version"] is None or _is_int(raw["parent_version"]), "parent version")
    _need(type(raw["created_at"]) is float, "created_at")
    _need(isinstance(raw["model"], dict), "model description")
    _need(isinstance(raw["files"], list) and len(raw["files"]) > 0, "file list")
    files = tuple(_decode_file(f) for f in raw["files"])
    _need(len({f.name for f in files}) == len(files), "duplicate file names")
    sizes = {f.name: f.size for f in files}
    _need(isinstance(raw["tensors"], list), "tensor index")
    tensors = tuple(_decode_tensor(t, sizes) for t in raw["tensors"])
    manifest = PolicyManifest(raw["run"], raw["version"], raw["parent_version"], raw["created_at"], raw["model"],
                              _decode_generation(raw["generation"]), tensors, files)
    try:
        canonical = manifest.encode()
    except Exception:  # e.g. mixed key types inside the model description
        raise ManifestError("policy manifest is malformed: model description cannot be encoded") from None
    _need(canonical == data, "not in canonical form")
    return manifest
