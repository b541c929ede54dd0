"""Which key may sign a run's policies.

Why trust-on-first-use exists at all: `swarm peer start --role seed --bootstrap ADDR` must work with nothing but an
address, as the issue's command line shows. A peer given `--trainer-key` (hex public key or key file) pins that key;
a peer given none adopts the key of the first manifest it sees for the run, says so on one line, and pins it in its
data directory, so a later forger cannot take over the run (SSH-style). Pin the key for anything that matters.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path

from p2p.identity import IdentityError, public_bytes_from_peer_id, read_key_file
from swarm.errors import UserError

log = logging.getLogger(__name__)
_HEX_KEY = re.compile(r"^[0-9a-fA-F]{64}$")


def parse_trainer_key(text: str) -> bytes | None:
    """A raw 32-byte Ed25519 public key from hex or from a key file; None when `text` is empty."""
    if not text:
        return None
    return parse_public_key(text, "--trainer-key")


def parse_public_key(text: str, flag: str) -> bytes:
    """A raw 32-byte Ed25519 public key from 64 hex digits, a peer id (what every peer prints) or a key file."""
    if _HEX_KEY.match(text):
        return bytes.fromhex(text)

    if text.startswith("12D3KooW"):
        try:
            return public_bytes_from_peer_id(text)
        except IdentityError:
            raise UserError(f"{flag} {text!r} is not a valid peer id") from None
    path = Path(text)
    if not path.is_file():
        raise UserError(f"{flag} {text!r} is neither a 64-hex-digit public key, a peer id nor an existing key file")
    return read_key_file(path).public_bytes


class TrainerTrust:
    """The run's trainer key: pinned from config, from an earlier pin on disk, or adopted on first use."""

    def __init__(self, run: str, configured: bytes | None, data_dir: Path) -> None:
        self.run = run
        self._pin_path = Path(data_dir) / f"trainer-key-{_safe(run)}.hex"
        pinned = self._read_pin()
        if configured is not None and pinned is not None and configured != pinned:
            log.warning("run %s: --trainer-key differs from the key pinned earlier; using --trainer-key", run)
        self.key = configured if configured is not None else pinned
        if configured is not None:
            self._write_pin(configured)

    def accept(self, signer: bytes) -> bool:
        """True when `signer` is (or, on first use, becomes) the run's trainer key."""
        if self.key is None:
            self.key = bytes(signer)
            self._write_pin(self.key)
            log.warning("run %s: trusting trainer key %s on first use (pass --trainer-key to pin it)",
                        self.run, self.key.hex())
        return bytes(signer) == self.key

    def _read_pin(self) -> bytes | None:
        try:
            text = self._pin_path.read_text().strip()
        except FileNotFoundError:
            return None
        return bytes.fromhex(text) if _HEX_KEY.match(text) else None

    def _write_pin(self, key: bytes) -> None:
        self._pin_path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self._pin_path.with_suffix(".tmp")
        tmp.write_text(key.hex() + "\n")
        tmp.replace(self._pin_path)


def _safe(run: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]", "_", run)[:64]
