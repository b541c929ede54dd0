"""Policy manifest values: the frozen, typed form every manifest takes once decoded, and its canonical encoding.

Kept apart from building (p2p.pieces.manifest) and decoding (p2p.pieces.manifest_decode) so both use one definition of
what a manifest is; nothing here does IO or reads the clock.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass, field

import blake3
import msgpack

from p2p.packed import Packed

FORMAT_VERSION = 2
DEFAULT_PIECE_SIZE = 1 << 20
MIN_PIECE_SIZE = 256 * 1024
MAX_PIECE_SIZE = 4 << 20
MAX_MANIFEST_BYTES = 32 << 20  # a 62 GB policy at 1 MiB pieces needs about 2.1 MB of hashes
MODEL_FILE = "model.json"
_SAFE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


def is_safe_file_name(name: str) -> bool:
    """Whether a manifest may carry a file of this name: a bare name (no path), never model.json."""
    return bool(_SAFE_NAME.match(name)) and name != MODEL_FILE


class FrozenMap(dict):
    """A dict that refuses changes: a decoded manifest's model description, so that no reader can change what
    the manifest id was computed over. Still a dict for every reader (isinstance, json, msgpack, ==)."""

    def _refuse(self, *args: object, **kwargs: object) -> None:
        raise TypeError("a manifest's model description is read-only")

    __setitem__ = __delitem__ = __ior__ = clear = pop = popitem = setdefault = update = _refuse  # type: ignore

    def __reduce__(self):  # copies and pickles are built from the items, never item by item
        return (FrozenMap, (dict(self),))


def freeze(value: Packed) -> Packed:
    """`value` with every map inside it made a FrozenMap (lists and scalars are kept)."""
    if isinstance(value, dict):
        return FrozenMap({k: freeze(v) for k, v in value.items()})
    if isinstance(value, list):
        return [freeze(v) for v in value]
    return value


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
    hash: bytes
    """BLAKE3 of the tensor's bytes: what a tensor rebuilt from a patch must hash to, and how a peer sees which
    tensors a new version changed."""


@dataclass(frozen=True)
class PatchRef:
    """A version that can also be rebuilt from its parent: the patch file and the exact parent it applies to.

    The version's full files stay in its manifest, so a peer without that parent fetches them instead; one
    holding it fetches the patch (p2p.pieces.patch) and rebuilds the full files, which it then serves too."""

    parent_id: bytes  # manifest id of the parent version
    parent_version: int
    file: str  # name of the patch file among the manifest's files


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
    model: dict  # a FrozenMap once decoded (p2p.pieces.manifest_decode)
    generation: GenerationSettings
    tensors: tuple[TensorEntry, ...]
    files: tuple[FileEntry, ...]
    patch: PatchRef | None = None
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

    @property
    def patch_file(self) -> FileEntry | None:
        """The file entry of this version's patch, or None for a keyframe (full files only)."""
        if self.patch is None:
            return None
        return next(f for f in self.files if f.name == self.patch.file)

    def full_size(self) -> int:
        """Bytes of the version's full form: every file but its patch."""
        return sum(f.size for f in self.files if self.patch is None or f.name != self.patch.file)

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
            "patch": None if self.patch is None else _asdict(self.patch),
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


def _asdict(obj: GenerationSettings | TensorEntry | PatchRef) -> dict[str, Packed]:
    return {k: getattr(obj, k) for k in obj.__dataclass_fields__}


def _canonical(value: Packed) -> Packed:
    if isinstance(value, dict):
        return {k: _canonical(value[k]) for k in sorted(value)}
    if isinstance(value, (list, tuple)):
        return [_canonical(v) for v in value]
    return value
