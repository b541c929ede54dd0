"""Which key may sign a run's policies.

Why trust-on-first-use exists at all: `swarm peer start --role seed --bootstrap ADDR` must work with nothing but an
address, as the issue's command line shows. A peer given `--trainer-key` (hex public key or key file) pins that key;
a peer given none adopts the key of the first manifest it sees for the run, says so on one line, and pins it in its
data directory, so a later forger cannot take over the run (SSH-style). Pin the key for anything that matters.

Why refusals are folded into one line a minute (RefusalReport): a peer given a wrong key refuses every manifest the
real trainer sends, several a second; one line naming the key expected and the key that signed says everything,
and a peer that hears nothing else for `wrong_key_timeout_s` gives up with status 1 instead of waiting for ever.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from pathlib import Path

from p2p.identity import IdentityError, peer_id_from_public_bytes, public_bytes_from_peer_id, read_key_file
from swarm.errors import UserError

log = logging.getLogger(__name__)
_HEX_KEY = re.compile(r"^[0-9a-fA-F]{64}$")
REPORT_EVERY_S = 60.0
"""A refused manifest is reported at most this often; the refusals between two lines are counted in the second."""


@dataclass
class RefusalReport:
    """When a refused manifest is worth a line, and when a peer that only ever refused gives up (pure: the caller
    passes the time)."""

    give_up_after_s: float = 300.0  # PeerSection.wrong_key_timeout_s; 0: never
    every_s: float = REPORT_EVERY_S
    first_refused: float | None = None  # when the first wrong-key manifest was refused, while none was accepted
    wrong_keys: int = 0  # manifests refused for the key that signed them (TrainerTrust.wrong_key)
    last_line: float | None = None  # when the last line was said
    unsaid: int = 0  # refusals since then that said nothing
    accepted: bool = False  # a manifest signed by the run's key has been seen

    def refused(self, reason: str, now: float) -> str | None:
        """The line to say about this refusal, or None to stay quiet (one was said less than `every_s` ago)."""
        if self.first_refused is None and self.wrong_keys and not self.accepted:  # a forged signature alone
            self.first_refused = now  # says nothing of this peer's key: only a wrong key starts the clock
        if self.last_line is not None and now - self.last_line < self.every_s:
            self.unsaid += 1
            return None
        folded = f" ({self.unsaid} more refused since the last line)" if self.unsaid else ""
        self.last_line, self.unsaid = now, 0
        return reason + folded

    def accept(self) -> None:
        self.accepted, self.first_refused = True, None

    def gave_up(self, now: float) -> bool:
        """True once manifests have been refused for `give_up_after_s` with none accepted."""
        return bool(self.give_up_after_s) and self.first_refused is not None and \
            now - self.first_refused >= self.give_up_after_s


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

    def __init__(self, run: str, configured: bytes | None, data_dir: Path, give_up_after_s: float = 300.0) -> None:
        self.run = run
        self.report = RefusalReport(give_up_after_s)
        self._pin_path = Path(data_dir) / f"trainer-key-{_safe(run)}.hex"
        pinned = self._read_pin()
        self._source = "--trainer-key" if configured is not None else f"pinned in {self._pin_path}"
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
            self._source = f"trusted on first use, pinned in {self._pin_path}"
        if bytes(signer) != self.key:
            return False
        self.report.accept()
        return True

    def wrong_key(self, signer: bytes) -> str:
        """One sentence naming the key this peer expects, where that came from, and the key that signed."""
        assert self.key is not None, "a signer is wrong only against a key"
        self.report.wrong_keys += 1
        return (f"a policy manifest of run {self.run} is signed by {peer_id_from_public_bytes(bytes(signer))}, but "
                f"this peer expects the trainer key {peer_id_from_public_bytes(self.key)} ({self._source}); "
                "give the trainer's peer id with --trainer-key if that is the wrong one")

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
