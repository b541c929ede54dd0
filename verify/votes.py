"""Signed validator votes and the deterministic choice of which validators check which rollout.

Why Ed25519 over raw 32-byte keys: a vote must be attributable to one validator and unforgeable, and verify/ must
not depend on p2p/ (which owns libp2p identities); the raw public key is the validator's name here, the swarm layer
maps it to a peer id. Why rendezvous hashing: every peer computes the same r validators for a rollout from its
slot and the validator set alone, with no coordination, and a validator joining or leaving moves only the
rollouts it wins or held. Why the slot and never the bytes: a worker chooses its group's bytes (one logprob
jittered, one completion reordered), so an assignment keyed on them lets it grind until colluding validators are
drawn; the slot (run, version, worker, step, task) is fixed by the run's schedule before the worker generates.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import blake3
import msgpack
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

VOTE_VERSION = 1
MAX_CHECKS = 32
MAX_REASON = 200


class VoteError(ValueError):
    """A vote that does not parse; the message names the first problem."""

    user_facing = True


@dataclass(frozen=True)
class Vote:
    """One validator's signed verdict on one rollout group.

    rollout_id: BLAKE3 of the group's canonical bytes (32). validator: the voter's raw Ed25519 public key (32).
    accept: the verdict. checks: (check name, passed, reason) for each check run, reasons cut to 200 characters.
    signature: Ed25519 over `signed_bytes()` (64).
    """

    rollout_id: bytes
    validator: bytes
    accept: bool
    checks: tuple[tuple[str, bool, str], ...]
    signature: bytes = b""

    def signed_bytes(self) -> bytes:
        """Canonical msgpack of everything but the signature, prefixed with a domain tag."""
        body = [VOTE_VERSION, self.rollout_id, self.validator, self.accept, [list(c) for c in self.checks]]
        return b"swarm-vote\x00" + msgpack.packb(body, use_bin_type=True)

    def to_wire(self) -> dict:
        return {"v": VOTE_VERSION, "rollout_id": self.rollout_id, "validator": self.validator, "accept": self.accept,
                "checks": [list(c) for c in self.checks], "sig": self.signature}

    @classmethod
    def from_wire(cls, obj: object) -> "Vote":
        """Parse a hostile wire dict (the signature is not checked here: see verify_vote)."""
        if not isinstance(obj, dict) or obj.get("v") != VOTE_VERSION:
            raise VoteError("vote must be a dict of version 1")
        rollout_id, validator, sig = obj.get("rollout_id"), obj.get("validator"), obj.get("sig")
        if not (isinstance(rollout_id, bytes) and len(rollout_id) == 32):
            raise VoteError("vote rollout_id must be 32 bytes")
        if not (isinstance(validator, bytes) and len(validator) == 32):
            raise VoteError("vote validator must be a 32-byte public key")
        if not (isinstance(sig, bytes) and len(sig) == 64):
            raise VoteError("vote signature must be 64 bytes")
        if not isinstance(obj.get("accept"), bool):
            raise VoteError("vote accept must be a bool")
        checks = obj.get("checks")
        if not isinstance(checks, list) or len(checks) > MAX_CHECKS:
            raise VoteError(f"vote checks must be a list of at most {MAX_CHECKS}")
        parsed = []
        for c in checks:
            if not (isinstance(c, list) and len(c) == 3 and isinstance(c[0], str) and len(c[0]) <= 64
                    and isinstance(c[1], bool) and isinstance(c[2], str) and len(c[2]) <= MAX_REASON):
                raise VoteError("vote check must be [name, ok, reason]")
            parsed.append((c[0], c[1], c[2]))
        return cls(rollout_id, validator, obj["accept"], tuple(parsed), sig)


def public_key_of(private_key: bytes) -> bytes:
    """The raw 32-byte public key of a raw 32-byte Ed25519 private key."""
    key = Ed25519PrivateKey.from_private_bytes(private_key).public_key()
    return key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


def sign_vote(private_key: bytes, rollout_id: bytes, accept: bool, checks) -> Vote:
    """A signed vote; `checks` is a sequence of objects with name/ok/reason (verify.checks.CheckResult)."""
    rows = tuple((c.name, bool(c.ok), c.reason[:MAX_REASON]) for c in checks)
    unsigned = Vote(rollout_id, public_key_of(private_key), bool(accept), rows)
    signature = Ed25519PrivateKey.from_private_bytes(private_key).sign(unsigned.signed_bytes())
    return Vote(unsigned.rollout_id, unsigned.validator, unsigned.accept, unsigned.checks, signature)


def vote_from_verdict(private_key: bytes, verdict) -> Vote:
    """Sign a verify.verifier.Verdict."""
    return sign_vote(private_key, verdict.rollout_id, verdict.accepted, verdict.checks)


def verify_vote(vote: Vote) -> bool:
    """True when the signature is the validator's over this exact vote."""
    try:
        Ed25519PublicKey.from_public_bytes(vote.validator).verify(vote.signature, vote.signed_bytes())
        return True
    except (InvalidSignature, ValueError, TypeError):
        return False


def assign_validators(slot_key: bytes, validators: Sequence[bytes], replicas: int) -> tuple[bytes, ...]:
    """The `replicas` validators with the highest BLAKE3(slot key || validator) (rendezvous hashing), where the slot
    key is verify.rollout.Slot.key() of the rollout: every group of one slot, whatever its bytes, gets the same ones."""
    ranked = sorted(set(validators), key=lambda v: blake3.blake3(b"rendezvous-slot-v1\x00" + slot_key + v).digest(),
                    reverse=True)
    return tuple(ranked[:replicas])
