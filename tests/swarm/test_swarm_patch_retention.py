"""Versions that leave the window are forgotten: a version fetched as a patch must not keep its parent (and through
it every earlier version of the run, their manifests and services) alive once both are dropped."""

from __future__ import annotations

import gc
import weakref

import trio
import trio.testing

from p2p.identity import Identity
from p2p.pieces.manifest import PatchRef
from p2p.pieces.patch import encode_patch
from p2p.pieces.store import PieceStore
from tests.patch_versions import manifest_of, nudged, signed, weights, write_version
from tests.swarm.test_swarm_patch_versions import PEER, mirror


async def test_dropped_versions_are_not_kept_alive_through_their_childrens_parent_links(tmp_path):
    key = Identity.generate()
    tensors, previous, chain = weights(0), None, []
    for v in range(1, 8):
        directory = write_version(tmp_path / f"v{v}", tensors)
        ref = None
        if previous is not None:
            encode_patch([tmp_path / f"v{v - 1}" / "model.safetensors"], [directory / "model.safetensors"],
                         directory / "model.patch")
            ref = PatchRef(previous.id, v - 1, "model.patch")
        previous = manifest_of(directory, v, ref)
        chain.append(signed(previous, key))
        tensors = nudged(tensors, seed=v)
    with PieceStore(tmp_path / "s-peer") as store:
        peer = mirror(tmp_path, PEER, key, store)  # keep=3
        async with trio.open_nursery() as nursery:
            await nursery.start(peer.run_service)
            first = weakref.ref(peer.adopt(chain[0]))
            for signed_bytes in chain[1:]:
                assert peer.adopt(signed_bytes).parent is not None  # each follows the one before
            with trio.fail_after(10):
                await trio.testing.wait_all_tasks_blocked()
            assert len(peer.policies) == 3
            gc.collect()
            newest = peer.latest()
            depth, p = 0, newest
            while p.parent is not None:
                depth, p = depth + 1, p.parent
            assert first() is None, f"v1 left the window long ago and is still reachable ({depth} parents deep)"
            nursery.cancel_scope.cancel()
