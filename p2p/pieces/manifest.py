"""Policy manifests: a policy version as content-addressed pieces, signed by the run's trainer key.

A manifest names every piece of every safetensors file by its BLAKE3 hash, so a peer can verify each piece the
moment it lands (BitTorrent v2 style) instead of one hash over a reassembled file (SHARDCAST). Its id is the BLAKE3
of its canonical msgpack encoding, so the same content always has the same name and any peer can serve it.

Rules: building streams files in piece-sized reads into one reused buffer (a seed of a 1 GB policy stays small);
nothing here reads the wall clock (`created_at` is passed in). The values live in p2p.pieces.manifest_types and the one
decoder every received manifest goes through in p2p.pieces.manifest_decode; this module re-exports both.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable

import blake3
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from p2p.errors import ManifestError
from p2p.pieces.manifest_decode import decode_manifest, decode_signed
from p2p.pieces.manifest_types import (
    DEFAULT_PIECE_SIZE,
    FORMAT_VERSION,
    MAX_MANIFEST_BYTES,
    MAX_PIECE_SIZE,
    MIN_PIECE_SIZE,
    MODEL_FILE,
    FileEntry,
    GenerationSettings,
    PatchRef,
    PieceRef,
    PolicyManifest,
    SignedManifest,
    TensorEntry,
    is_safe_file_name,
)

__all__ = [
    "DEFAULT_PIECE_SIZE", "FORMAT_VERSION", "MAX_MANIFEST_BYTES", "MAX_PIECE_SIZE", "MIN_PIECE_SIZE", "MODEL_FILE",
    "SIG_CONTEXT", "FileEntry", "GenerationSettings", "PatchRef", "PieceRef", "PolicyManifest", "SignedManifest",
    "TensorEntry",
    "VerifiedManifest", "build_manifest", "decode_manifest", "decode_signed", "describe_policy_dir", "file_entry",
    "is_safe_file_name", "open_signed_manifest", "piece_hashes", "read_safetensors_index", "sign_manifest",
    "tensor_digest", "verify_manifest",
]

MAX_SAFETENSORS_HEADER = 100 << 20
SIG_CONTEXT = b"rl-swarm/policy-manifest/v1\x00"  # domain separation: this key also signs gossip envelopes


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
                            meta["data_offsets"][1] - meta["data_offsets"][0], meta["dtype"], tuple(meta["shape"]),
                            b"")
                for name, meta in sorted(header.items()) if name != "__metadata__"]
    except (AttributeError, KeyError, IndexError, TypeError, ValueError):
        raise ManifestError(f"{path.name} has a safetensors header that does not describe its tensors") from None


def tensor_digest(path: Path, offset: int, nbytes: int, chunk: int = 1 << 20) -> bytes:
    """BLAKE3 of `nbytes` of a file from `offset`, read a MiB at a time (a tensor never sits in memory whole)."""
    hasher = blake3.blake3()
    with open(path, "rb", buffering=0) as fh:
        for start in range(offset, offset + nbytes, chunk):
            hasher.update(os.pread(fh.fileno(), min(chunk, offset + nbytes - start), start))
    return hasher.digest()


def hash_tensors(policy_dir: Path, tensors: list[TensorEntry]) -> list[TensorEntry]:
    """The entries with the BLAKE3 of each tensor's bytes."""
    return [replace(e, hash=tensor_digest(policy_dir / e.file, e.offset, e.nbytes)) for e in tensors]


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
    patch: PatchRef | None = None,
) -> PolicyManifest:
    """Build the manifest of a directory of *.safetensors files plus its model.json description.

    data_files: names of other files in the directory that travel with the weights (the run's task file): pieces
    and a root like the weights', no tensors. Loaders read only *.safetensors, so they never see them.
    patch: the version's patch over its parent (p2p.pieces.patch), a file of the directory listed after the others.
    """
    policy_dir = Path(policy_dir)
    if not MIN_PIECE_SIZE <= piece_size <= MAX_PIECE_SIZE:
        raise ManifestError(f"piece size {piece_size} is outside {MIN_PIECE_SIZE}..{MAX_PIECE_SIZE} bytes")
    model, paths, tensors = describe_policy_dir(policy_dir)
    files = [file_entry(path, piece_size) for path in paths]
    for name in data_files + ((patch.file,) if patch is not None else ()):
        path = policy_dir / name
        if not is_safe_file_name(name) or path.suffix == ".safetensors" or not path.is_file():
            raise ManifestError(f"data file {name!r} is not a plain file of {policy_dir} with a safe, non-weight name")
        files.append(file_entry(path, piece_size))
    manifest = PolicyManifest(run, version, parent_version, float(created_at), model, generation,
                              tuple(hash_tensors(policy_dir, tensors)), tuple(files), patch)
    return decode_manifest(manifest.encode())  # one validation path for built and received manifests


# ---------------------------------------------------------------------------------------------- signing


def sign_manifest(manifest: PolicyManifest, sign: Callable[[bytes], bytes], public_key: bytes) -> SignedManifest:
    """Sign the manifest id (with a domain-separation prefix) using the trainer's key."""
    encoded = manifest.encode()
    digest = blake3.blake3(encoded).digest()
    return SignedManifest(encoded, bytes(public_key), sign(SIG_CONTEXT + digest))


def verify_manifest(signed_bytes: bytes, trainer_public_key: bytes) -> PolicyManifest:
    """Decode and verify a signed manifest; only one signed by `trainer_public_key` is ever returned."""
    return open_signed_manifest(signed_bytes, trainer_public_key).manifest


@dataclass(frozen=True)
class VerifiedManifest:
    """A manifest whose signature checked out, with the key that made it."""

    manifest: PolicyManifest
    signer: bytes
    """Raw 32-byte Ed25519 public key of the signer."""


def open_signed_manifest(signed_bytes: bytes, trainer_public_key: bytes | None = None) -> VerifiedManifest:
    """The one way from received bytes to a manifest: size and field checks, the signer against
    `trainer_public_key` (None: any signer, for trust on first use and `swarm status`), the signature, then every
    field of the manifest. Raises ManifestError only."""
    signed = decode_signed(signed_bytes)
    if trainer_public_key is not None and signed.public_key != trainer_public_key:
        raise ManifestError("policy manifest is not signed by this run's trainer key")
    try:
        Ed25519PublicKey.from_public_bytes(signed.public_key).verify(signed.signature, SIG_CONTEXT + signed.id)
    except (InvalidSignature, ValueError):
        raise ManifestError("policy manifest signature is invalid") from None
    return VerifiedManifest(decode_manifest(signed.manifest_bytes), signed.public_key)
