"""When the trainer publishes a version as a patch over its parent, and when as a keyframe (full files only).

Every version's manifest carries its full files, so a peer that lacks the parent never needs a chain; a keyframe
is a version without a patch. One is due every `keyframe_every` versions when that is set (a run may want a
periodic point where every peer fetches whole files, say after changing what it trains), and whenever the patch
would not pay: the first version, a publish dtype of float32 (nearly every element changes every step), or a patch
of more than PATCH_MAX_SHARE of the full copy, when its savings no longer outweigh a second form to seed.
"""

from __future__ import annotations

from typing import Protocol

from p2p.pieces.manifest import PolicyManifest

WEIGHTS = "model.safetensors"
PATCH_FILE = "model.patch"
PATCH_MAX_SHARE = 0.5


def keyframe_due(version: int, keyframe_every: int) -> bool:
    """Whether `version` is published whole by the schedule (0: only when a patch would not pay)."""
    return keyframe_every > 0 and version % keyframe_every == 0


def patch_pays(patch_bytes: int, full_bytes: int) -> bool:
    return patch_bytes <= PATCH_MAX_SHARE * full_bytes


class HasManifest(Protocol):
    manifest: PolicyManifest


def changed_tensors(loaded: HasManifest | None, new: PolicyManifest) -> frozenset[str] | None:
    """The tensors an inference peer must copy to go from the version it has loaded to `new`: those whose signed
    hashes differ (None: all of them, when the loaded version is not known or the tensor sets differ)."""
    if loaded is None:
        return None
    before = {t.name: t.hash for t in loaded.manifest.tensors}
    after = {t.name: t.hash for t in new.tensors}
    if before.keys() != after.keys():
        return None
    return frozenset(name for name, digest in after.items() if before[name] != digest)
