"""Announcing the pieces of files rebuilt from a patch: a model of more than MAX_OUTBOX pieces (4 GiB at the default
1 MiB pieces) must not have every linked peer dropped as one that "does not read what we send"."""

from __future__ import annotations

import blake3
import trio

from p2p.pieces.manifest_types import FileEntry, GenerationSettings, PatchRef, PolicyManifest
from p2p.pieces.outbox import Outbox
from p2p.pieces.store import PieceStore
from p2p.pieces.transfer import MAX_OUTBOX, SwarmService, _Link
from swarm.policy.patch_form import form_flags

PIECE = 256 * 1024


def _entry(name: str, pieces: int) -> FileEntry:
    hashes = tuple(blake3.blake3(f"{name}{i}".encode()).digest() for i in range(pieces))
    return FileEntry(name, pieces * PIECE, PIECE, hashes, blake3.blake3(b"".join(hashes)).digest())


async def test_announcing_a_large_rebuilt_version_keeps_its_links(tmp_path):
    weights, patch = _entry("model.safetensors", MAX_OUTBOX + 100), _entry("model.patch", 4)
    manifest = PolicyManifest("r", 2, 1, 0.0, {}, GenerationSettings(2, 1.0, 8, 0), (), (weights, patch),
                              PatchRef(b"\x01" * 32, 1, "model.patch"))
    with PieceStore(tmp_path / "s") as store:  # sparse files: nothing is written
        service = SwarmService(manifest, store, wanted=form_flags(manifest, patch_form=True))
        service._links["seed"] = _Link("seed", None, Outbox(), None, None, greeted=True)
        holds = bytes(0 if ref.file is weights else 1 for ref in manifest.pieces)  # a peer holding the patch too
        service.engine.peer_connected("seed", holds, trio.current_time())
        service.add_stored([ref.index for ref in manifest.pieces if ref.file is weights])  # rebuilt from the patch
        assert "seed" not in service.drops, service.drops.get("seed")
