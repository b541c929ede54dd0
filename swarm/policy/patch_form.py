"""Which form of a version a peer fetches, its full files or its patch, and rebuilding full files from a patch.

A version after a keyframe carries both forms in one signed manifest (p2p.pieces.manifest_types.PatchRef). A peer
that mirrors the exact parent the patch names fetches the patch, waits for that parent's full files, rebuilds the
version's full files from them (p2p.pieces.patch: every tensor against its signed hash, then every piece against
the manifest) and from then on serves both forms. A peer without that parent fetches the full files: catching up
never costs more than one full copy, and no manifest can make a peer walk a chain of versions. A patch that cannot
be applied (its parent left the window, or it does not rebuild what its manifest signs) costs one line and the
fetch of the full files instead; nothing it produced is kept.
"""

from __future__ import annotations

import logging
import mmap
import shutil
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Protocol

import trio

from p2p.errors import P2PError
from p2p.pieces.manifest import PolicyManifest
from p2p.pieces.patch import apply_patch
from p2p.pieces.patch_format import TensorLayout
from p2p.pieces.store import PieceStore, check_rebuilt
from p2p.pieces.transfer import SwarmService

log = logging.getLogger(__name__)


class Mirrored(Protocol):
    """What this module reads of a mirrored version (swarm.policy.mirror.MirroredPolicy)."""

    manifest: PolicyManifest
    service: SwarmService | None
    ready: trio.Event


def form_flags(manifest: PolicyManifest, patch_form: bool) -> bytes | None:
    """The pieces to fetch: None (all) for a keyframe; else every piece but the full weight files' (the patch form)
    or every piece but the patch's (the full form)."""
    patch = manifest.patch_file
    if patch is None:
        return None
    skip = (lambda f: f.name.endswith(".safetensors")) if patch_form else (lambda f: f is patch)
    return bytes(0 if skip(ref.file) else 1 for ref in manifest.pieces)


def patch_parent(manifest: PolicyManifest, policies: dict[bytes, Mirrored]) -> Mirrored | None:
    """The mirrored version this one's patch applies to, if this peer follows exactly that one."""
    if manifest.patch is None:
        return None
    parent = policies.get(manifest.patch.parent_id)
    if parent is None or parent.manifest.version != manifest.patch.parent_version:
        return None
    return parent


def expected_tensors(manifest: PolicyManifest) -> dict[str, tuple[str, TensorLayout, bytes]]:
    return {t.name: (t.file, TensorLayout(t.name, t.dtype, t.shape, t.offset, t.nbytes), t.hash)
            for t in manifest.tensors}


def rebuild_files(patch: Path, parent_weights: list[Path], out: Path, manifest: PolicyManifest) -> list[Path]:
    """Rebuild `manifest`'s weight files in `out` from the parent's and the patch, each checked piece by piece.
    Runs in a worker thread: it is handed paths resolved beforehand and touches no state of the store."""
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    with open(patch, "rb") as fh:  # the map outlives the file; it closes once no view of it is left
        mapped = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
    files = apply_patch(memoryview(mapped), parent_weights, out, expected_tensors(manifest))
    for path in files:
        check_rebuilt(manifest, path.name, path)
    return files


async def make_full(policy: Mirrored, store: PieceStore, parent: Mirrored | None,
                    still_mirrored: Callable[[Mirrored], bool], changed: Callable[[], trio.Event],
                    holding: Callable[[Mirrored], AbstractContextManager]) -> None:
    """Return once `policy`'s full files are held: fetched, or rebuilt from its patch over `parent`."""
    service = policy.service
    await trio.lowlevel.checkpoint()  # a version dropped before its watcher ran ends here, not in the store
    if not store.holds_full(policy.manifest):
        await service.completed.wait()
    if store.holds_full(policy.manifest):
        return
    problem = "its parent left the window first"
    if parent is not None:
        while not parent.ready.is_set() and still_mirrored(parent):
            await changed().wait()
        if parent.ready.is_set() and still_mirrored(parent):
            problem = await _rebuild(policy, store, parent, still_mirrored, holding)
            if problem is None:
                return
    log.warning("policy v%d: its patch cannot be applied (%s); fetching its full files", policy.manifest.version,
                problem)
    service.want(form_flags(policy.manifest, patch_form=False) or bytes([1]) * policy.manifest.num_pieces)
    await service.completed.wait()


async def _rebuild(policy: Mirrored, store: PieceStore, parent: Mirrored,
                   still_mirrored: Callable[[Mirrored], bool],
                   holding: Callable[[Mirrored], AbstractContextManager]) -> str | None:
    """Rebuild and adopt `policy`'s full files; None when done, else why not (one line). Both versions are held
    meanwhile, so neither leaves the store under the worker thread; any error of the rebuild, whatever its type,
    costs this version its patch, never the mirror."""
    manifest = policy.manifest
    out = store.rebuild_dir() / manifest.id.hex()[:16]
    with holding(parent), holding(policy):
        try:
            patch, weights = store.file_path(manifest, manifest.patch.file), store.weight_paths(parent.manifest)
            files = await trio.to_thread.run_sync(rebuild_files, patch, weights, out, manifest)
            if not still_mirrored(policy):
                return "it left the window while it was rebuilt"
            added = [i for path in files for i in store.adopt_rebuilt(manifest, path.name, path)]
        except Exception as exc:  # noqa: BLE001 - a patch signed by the run's key can still be wrong: fall back
            return str(exc) if isinstance(exc, P2PError) else f"{type(exc).__name__}: {exc}"
        finally:
            shutil.rmtree(out, ignore_errors=True)
    policy.service.add_stored(added)
    return None
