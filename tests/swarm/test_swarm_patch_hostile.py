"""A mirror fetching versions as patches, under hostile or unlucky conditions: a patch its manifest signs but that
names a stray file, a version pushed out of the window while its patch is applied in a worker thread, a restart
holding a version's full files but not its patch. Each costs at most a fallback, never the mirror (the node's whole
policy service)."""

from __future__ import annotations

import trio

import swarm.policy.mirror as mirror_module
import swarm.policy.patch_form as patch_form
from p2p.identity import Identity
from p2p.pieces.manifest import PatchRef
from p2p.pieces.patch import encode_patch
from p2p.pieces.store import PieceStore
from tests.p2p.test_p2p_patch_hostile import _with_extra_file
from tests.patch_versions import manifest_of, nudged, parent_and_child, signed, weights, write_version
from tests.swarm.test_swarm_patch_versions import ORIGIN, PEER, fetched, link, mirror, origin_and_peer


async def test_a_signed_patch_naming_a_stray_file_falls_back_to_the_full_files(tmp_path):
    key = Identity.generate()
    parent_tensors = weights(0)
    old = write_version(tmp_path / "v1", parent_tensors)
    new = write_version(tmp_path / "v2", nudged(parent_tensors))
    parent = manifest_of(old, 1)
    encode_patch([old / "model.safetensors"], [new / "model.safetensors"], new / "model.patch")
    patch = new / "model.patch"
    patch.write_bytes(_with_extra_file(patch.read_bytes(), "extra.bin", first=False))
    child = manifest_of(new, 2, PatchRef(parent.id, 1, "model.patch"))
    async with origin_and_peer(tmp_path, key, [(parent, old), (child, new)]) as (nursery, origin, peer, s_peer):
        await fetched(nursery, peer, origin, signed(parent, key))
        await fetched(nursery, peer, origin, signed(child, key))  # a fallback, not a crash of the mirror
        assert s_peer.file_path(child, "model.safetensors").read_bytes() == (new / "model.safetensors").read_bytes()


async def test_a_version_pushed_out_of_the_window_while_its_patch_is_applied_does_not_crash_the_mirror(
        tmp_path, monkeypatch):
    key = Identity.generate()
    parent, child, old, new = parent_and_child(tmp_path)
    newer = []
    for v in (3, 4, 5):
        d = write_version(tmp_path / f"v{v}", weights(v))
        newer.append(signed(manifest_of(d, v), key))
    with PieceStore(tmp_path / "s-origin") as s_origin, PieceStore(tmp_path / "s-peer") as s_peer:
        origin, peer = mirror(tmp_path, ORIGIN, key, s_origin), mirror(tmp_path, PEER, key, s_peer)
        real_rebuild, real_make_full = patch_form.rebuild_files, mirror_module.make_full
        finished = trio.Event()

        def rebuild_then_newer_versions(patch, parent_weights, out, manifest):
            files = real_rebuild(patch, parent_weights, out, manifest)
            # meanwhile the trainer published three more versions (a large model rebuilds for seconds)
            trio.from_thread.run_sync(lambda: [peer.adopt(s) for s in newer])
            return files

        async def make_full(*args, **kwargs):
            try:
                await real_make_full(*args, **kwargs)
            finally:
                finished.set()

        monkeypatch.setattr(patch_form, "rebuild_files", rebuild_then_newer_versions)
        monkeypatch.setattr(mirror_module, "make_full", make_full)
        async with trio.open_nursery() as nursery:
            for m in (origin, peer):
                await nursery.start(m.run_service)
            origin.adopt(signed(parent, key), local_dir=old)
            origin.adopt(signed(child, key), local_dir=new)
            await fetched(nursery, peer, origin, signed(parent, key))
            finished = trio.Event()
            policy = peer.adopt(signed(child, key))
            await link(nursery, peer, origin, policy)
            with trio.fail_after(30):
                await finished.wait()
            await trio.lowlevel.checkpoint()
            # held while it was rebuilt, so it stayed mirrored and is ready; the next collection drops it
            assert policy.ready.is_set() and s_peer.holds_full(child)
            assert not list(s_peer.rebuild_dir().iterdir()), "the rebuilt files stay on disk"
            peer._collect_garbage()  # the next collection: it leaves the window now that nobody holds it
            assert not peer.is_mirrored(policy)
            nursery.cancel_scope.cancel()


def _store_pieces(store: PieceStore, manifest, directory, names) -> None:
    for ref in manifest.pieces:
        if ref.file.name in names:
            with open(directory / ref.file.name, "rb") as fh:
                fh.seek(ref.offset)
                store.write_piece(manifest, ref.index, fh.read(ref.length))


async def test_a_restarted_peer_holding_a_versions_full_files_has_it_ready_without_fetching_its_patch(tmp_path):
    """Say it fetched the child whole (the parent came later), then restarted: the child is ready at once, it holds
    every file a loader reads. Instead its service now wants the patch, and without a peer it is never ready."""
    key = Identity.generate()
    parent, child, old, new = parent_and_child(tmp_path)
    with PieceStore(tmp_path / "s-peer") as store:
        store.add_manifest(parent, signed(parent, key))
        _store_pieces(store, parent, old, {"model.safetensors"})
        store.add_manifest(child, signed(child, key))
        _store_pieces(store, child, new, {"model.safetensors"})
        assert store.holds_full(parent) and store.holds_full(child) and not store.is_complete(child)
    with PieceStore(tmp_path / "s-peer") as store:
        peer = mirror(tmp_path, PEER, key, store)
        async with trio.open_nursery() as nursery:
            await nursery.start(peer.run_service)
            policy = peer.policies[child.id]
            with trio.fail_after(5):  # real time: nothing to fetch, nothing to rebuild
                await policy.ready.wait()
            nursery.cancel_scope.cancel()
