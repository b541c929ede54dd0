"""The signature check of announced manifests, run by gossip's validator before an announcement is forwarded, at a
cost to the node that no number of identities can raise. Pure state: `now` is passed in.

Why in the validator: py-libp2p forwards what every validator accepted, so an announcement whose manifest claims
the trainer's key with a forged signature would be forwarded by every peer before its handler refused it. Here an
inline manifest is refused, and never forwarded, unless it is signed by the run's trainer key (or, before a key is
pinned, by the key it names), is the manifest the announcement names (id and version), and decodes.

What that costs, cheapest first: the signed wrapper's fields and the signer against the pinned key (a dictionary's
work), the manifest's BLAKE3 (bounded by the envelope's size, which admission already pays for), a lookup among
the manifests verified before; only then a signature check and the manifest's decoding. Those draw on one allowance
for the whole node (`ManifestCheckConfig`), whatever the number of senders; past it an announcement is refused as
"node_busy", which costs nobody. The trainer announcing its own manifest (its envelope signed by the pinned key,
which nobody else holds) never waits on that allowance, so a crowd of forgers cannot hold a real version back.
"""

from __future__ import annotations

import collections
from dataclasses import dataclass

from p2p.errors import EnvelopeError, ManifestError
from p2p.pieces.manifest import decode_signed, open_signed_manifest
from p2p.ratelimit import Allowance

BUSY = "node_busy"
REASON = "bad_body"


@dataclass(frozen=True)
class ManifestCheckConfig:
    """How much signature checking announced manifests may cost one node."""

    verifications_per_s: float = 2.0
    """Signature checks (each with the manifest's decoding) per second for announcements not sent by the trainer
    itself, over every sender together. The trainer publishes a version every few minutes; only relays of others
    draw on this."""
    burst: float = 8.0
    """Such checks at once."""
    remembered: int = 64
    """Manifests whose signature checked out, kept so that copies of one announcement are checked once."""

    def __post_init__(self) -> None:
        if self.verifications_per_s <= 0 or self.burst < 1 or self.remembered < 1:
            raise ValueError("a manifest check needs a positive rate, a burst of one or more and a memory")


class ManifestSignatures:
    """Refuses announced manifests that do not verify (EnvelopeError "bad_body") or that the node has no allowance
    left to verify (EnvelopeError "node_busy"); see the module docstring."""

    def __init__(self, config: ManifestCheckConfig = ManifestCheckConfig()) -> None:
        self.config = config
        self._allowance = Allowance(config.verifications_per_s, config.burst)
        self._verified: collections.OrderedDict[tuple[bytes, bytes, bytes], tuple[bytes, int]] = (
            collections.OrderedDict())
        self.verifications = 0

    def check(self, signed_bytes: bytes, manifest_id: bytes, version: int, sender: bytes, key: bytes | None,
              now: float) -> None:
        """Return when `signed_bytes` is a manifest signed by `key` (or by the key it names while `key` is None)
        whose id and version are `manifest_id` and `version`; raise EnvelopeError otherwise. `sender` is the raw
        key that signed the announcement's envelope."""
        try:
            signed = decode_signed(signed_bytes)
        except ManifestError as exc:
            raise EnvelopeError(REASON, f"the announced manifest does not decode: {exc}") from None
        if key is not None and signed.public_key != key:
            raise EnvelopeError(REASON, "the announced manifest is not signed by the run's trainer key")
        signed_id = signed.id
        if signed_id != manifest_id:
            raise EnvelopeError(REASON, "the announcement names another manifest id than the manifest it carries")
        entry = (signed_id, signed.public_key, signed.signature)
        known = self._verified.get(entry)
        if known is None:
            known = self._verify(signed_bytes, signed.public_key, trainer=key is not None and sender == key, now=now)
            self._remember(entry, known)
        else:
            self._verified.move_to_end(entry)
        if known != (manifest_id, version):
            raise EnvelopeError(REASON, "the announced version is not the signed manifest's")

    def _verify(self, signed_bytes: bytes, signer: bytes, trainer: bool, now: float) -> tuple[bytes, int]:
        if not trainer and not self._allowance.take(1, now):
            raise EnvelopeError(BUSY, "this node checks no more manifest signatures for now")
        self.verifications += 1
        try:
            manifest = open_signed_manifest(signed_bytes, signer).manifest
        except ManifestError as exc:
            raise EnvelopeError(REASON, f"the announced manifest does not verify: {exc}") from None
        return manifest.id, manifest.version

    def _remember(self, entry: tuple[bytes, bytes, bytes], known: tuple[bytes, int]) -> None:
        self._verified[entry] = known
        while len(self._verified) > self.config.remembered:
            self._verified.popitem(last=False)
