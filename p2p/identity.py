"""A peer's Ed25519 identity, persisted as a raw 32-byte seed.

Why a raw seed and not libp2p's protobuf key format: the same file serves as a run's trainer key (written by
`swarm keygen`), so it must be trivially portable and inspectable; 32 bytes with mode 0600 is the smallest format
that cannot be misread. Signing goes through `cryptography` (the project's one crypto dependency) while the libp2p
KeyPair is derived from the same seed so the peer id and the envelope signer are the same key.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass
from pathlib import Path

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from libp2p.crypto.ed25519 import Ed25519PublicKey as Libp2pPublicKey
from libp2p.crypto.ed25519 import create_new_key_pair
from libp2p.crypto.keys import KeyPair
from libp2p.peer.id import ID

from p2p.errors import IdentityError

SEED_BYTES = 32
KEY_FILE_NAME = "identity.key"


@dataclass(frozen=True)
class Identity:
    """An Ed25519 key: signs envelopes and names the libp2p peer (both from one seed)."""

    seed: bytes

    def __post_init__(self) -> None:
        if len(self.seed) != SEED_BYTES:
            raise IdentityError(f"an Ed25519 seed must be {SEED_BYTES} bytes, got {len(self.seed)}")

    @classmethod
    def generate(cls) -> Identity:
        return cls(os.urandom(SEED_BYTES))

    @property
    def _private(self) -> Ed25519PrivateKey:
        return _private_key(self.seed)

    @property
    def public_bytes(self) -> bytes:
        """The raw 32-byte public key (what manifests and envelopes name as sender / trainer key)."""
        return _public_bytes(self.seed)

    @property
    def key_pair(self) -> KeyPair:
        """This identity as py-libp2p's key pair, which a host signs its Noise handshakes with."""
        return create_new_key_pair(self.seed)

    @property
    def peer_id(self) -> str:
        """The libp2p peer id (base58 multihash of the public key), e.g. 12D3KooW..."""
        return _peer_id(self.seed)

    def sign(self, data: bytes) -> bytes:
        return self._private.sign(data)

    @staticmethod
    def verify(public_bytes: bytes, data: bytes, sig: bytes) -> bool:
        """True only for a valid signature; malformed keys or signatures are False, never an exception."""
        try:
            Ed25519PublicKey.from_public_bytes(bytes(public_bytes)).verify(bytes(sig), bytes(data))
        except (InvalidSignature, ValueError, TypeError):
            return False
        return True

    def __repr__(self) -> str:  # never leak the seed into logs
        return f"Identity(peer_id={self.peer_id})"


# Derived once per seed: a host asks for its peer id on every stream it opens or admits, and deriving it (an Ed25519
# scalar multiplication and a base58 encoding) is 4 % of opening data channels in `swarm sim`. Kept outside the
# instance, so an Identity stays a plain, picklable value.
@functools.lru_cache(maxsize=16)
def _private_key(seed: bytes) -> Ed25519PrivateKey:
    return Ed25519PrivateKey.from_private_bytes(seed)


@functools.lru_cache(maxsize=16)
def _public_bytes(seed: bytes) -> bytes:
    return _private_key(seed).public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


@functools.lru_cache(maxsize=16)
def _peer_id(seed: bytes) -> str:
    return peer_id_from_public_bytes(_public_bytes(seed))


def peer_id_from_public_bytes(public_bytes: bytes) -> str:
    """The libp2p peer id of a raw Ed25519 public key (lets C map envelope senders to peers)."""
    return _peer_id_of_key(bytes(public_bytes))


@functools.lru_cache(maxsize=4096)
def _peer_id_of_key(public_bytes: bytes) -> str:
    """Cached: every gossip message names its sender by key, and the base58 encoding cost a few percent of a peer's
    CPU while heartbeats flowed. Bounded, so a crowd of fresh keys only evicts entries."""
    return str(ID.from_pubkey(Libp2pPublicKey.from_bytes(public_bytes)))


def public_bytes_from_peer_id(peer_id: str) -> bytes:
    """The raw Ed25519 public key embedded in an Ed25519 peer id (identity multihash); error otherwise."""
    try:
        key = ID.from_base58(peer_id).extract_public_key()
    except Exception as exc:  # noqa: BLE001 - any decoding failure means the id is unusable
        raise IdentityError(f"peer id {peer_id!r} does not embed an Ed25519 public key") from exc
    if key is None or len(key.to_bytes()) != SEED_BYTES:
        raise IdentityError(f"peer id {peer_id!r} does not embed an Ed25519 public key")
    return key.to_bytes()


def write_key_file(path: Path, identity: Identity) -> None:
    """Create `path` with mode 0600 holding the seed; refuses to overwrite an existing key."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError as exc:
        raise IdentityError(f"key file {path} already exists; refusing to overwrite it") from exc
    except OSError as exc:
        raise IdentityError(f"cannot create key file {path}: {exc.strerror}") from exc
    with os.fdopen(fd, "wb") as f:
        f.write(identity.seed)


def read_key_file(path: Path) -> Identity:
    """Load a key file written by `write_key_file`; a wrong size is a clear error, not a silent new key."""
    path = Path(path)
    try:
        seed = path.read_bytes()
    except FileNotFoundError as exc:
        raise IdentityError(f"key file {path} does not exist") from exc
    except OSError as exc:
        raise IdentityError(f"cannot read key file {path}: {exc.strerror}") from exc
    if len(seed) != SEED_BYTES:
        raise IdentityError(
            f"key file {path} is corrupt: expected a raw {SEED_BYTES}-byte Ed25519 seed, found {len(seed)} bytes"
        )
    return Identity(seed)


def load_or_create_identity(data_dir: Path) -> Identity:
    """The peer's persistent identity in `data_dir`, created on first start so the peer id survives restarts."""
    path = Path(data_dir) / KEY_FILE_NAME
    if path.exists():
        return read_key_file(path)
    identity = Identity.generate()
    write_key_file(path, identity)
    return identity
