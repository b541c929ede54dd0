"""Versions as patches in the mirror: a peer that follows the parent fetches the patch and rebuilds the full files
bit for bit (and serves them), a late peer fetches the full files, and a patch that does not rebuild what its
manifest signs costs the full files instead, never wrong weights."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import trio
import trio.testing

from p2p.identity import Identity
from p2p.pieces.manifest import PatchRef
from p2p.pieces.patch import encode_patch
from p2p.pieces.store import PieceStore
from swarm.policy.mirror import PolicyMirror
from swarm.policy.trust import TrainerTrust
from tests.patch_versions import manifest_of, nudged, parent_and_child, signed, weights, write_version

ORIGIN, PEER, LATE = "b-origin", "a-peer", "a-late"  # the smaller id dials


def mirror(tmp_path, name: str, key: Identity, store: PieceStore) -> PolicyMirror:
    return PolicyMirror(store, name, TrainerTrust("r", key.public_bytes, tmp_path / name), run="r", keep=3,
                        copies_dir=tmp_path / name / "copies")


async def link(nursery, follower: PolicyMirror, origin: PolicyMirror, policy) -> None:
    ours, theirs = trio.testing.memory_stream_pair()

    async def dial(peer):
        return ours

    nursery.start_soon(origin.accept_link, follower.my_id, theirs)
    nursery.start_soon(follower.outbound._dial_link, policy, origin.my_id, dial)


async def fetched(nursery, follower, origin, signed_bytes: bytes):
    policy = follower.adopt(signed_bytes)
    await link(nursery, follower, origin, policy)
    with trio.fail_after(30):  # real time: rebuilding runs in a worker thread, which a virtual clock jumps over
        await policy.ready.wait()
    return policy


def bytes_down(policy) -> int:
    return sum(policy.service.progress().bytes_down.values())


@asynccontextmanager
async def origin_and_peer(tmp_path, key: Identity, versions: list) -> AsyncIterator[tuple]:
    """(nursery, origin, peer, peer's store): two running mirrors, the origin serving each (manifest, directory) of
    `versions` from its own files."""
    with PieceStore(tmp_path / "s-origin") as s_origin, PieceStore(tmp_path / "s-peer") as s_peer:
        origin, peer = mirror(tmp_path, ORIGIN, key, s_origin), mirror(tmp_path, PEER, key, s_peer)
        async with trio.open_nursery() as nursery:
            for m in (origin, peer):
                await nursery.start(m.run_service)
            for manifest, directory in versions:
                origin.adopt(signed(manifest, key), local_dir=directory)
            yield nursery, origin, peer, s_peer
            nursery.cancel_scope.cancel()


async def test_a_follower_fetches_only_the_patch_and_a_late_peer_the_full_files(tmp_path):
    key = Identity.generate()
    parent, child, old, new = parent_and_child(tmp_path)
    full = (new / "model.safetensors").stat().st_size
    with (PieceStore(tmp_path / "s-origin") as s_origin, PieceStore(tmp_path / "s-peer") as s_peer,
          PieceStore(tmp_path / "s-late") as s_late):
        origin, peer, late = (mirror(tmp_path, ORIGIN, key, s_origin), mirror(tmp_path, PEER, key, s_peer),
                              mirror(tmp_path, LATE, key, s_late))
        async with trio.open_nursery() as nursery:
            for m in (origin, peer, late):
                await nursery.start(m.run_service)
            origin.adopt(signed(parent, key), local_dir=old)
            origin.adopt(signed(child, key), local_dir=new)
            await fetched(nursery, peer, origin, signed(parent, key))
            patched = await fetched(nursery, peer, origin, signed(child, key))
            assert bytes_down(patched) == (new / "model.patch").stat().st_size < full / 8
            rebuilt = s_peer.file_path(child, "model.safetensors")
            assert rebuilt.read_bytes() == (new / "model.safetensors").read_bytes()
            assert s_peer.is_complete(child)  # both forms held: it serves either

            caught_up = await fetched(nursery, late, peer, signed(child, key))  # from the peer that rebuilt it
            assert bytes_down(caught_up) == full
            assert s_late.file_path(child, "model.safetensors").read_bytes() == rebuilt.read_bytes()
            assert not s_late.is_complete(child) and s_late.holds_full(child)
            nursery.cancel_scope.cancel()


async def test_a_signed_patch_that_rebuilds_other_weights_costs_the_full_files_not_wrong_weights(
        tmp_path, caplog):
    key = Identity.generate()
    parent_tensors = weights(0)
    old = write_version(tmp_path / "v1", parent_tensors)
    new = write_version(tmp_path / "v2", nudged(parent_tensors, seed=1))
    decoy = write_version(tmp_path / "decoy", nudged(parent_tensors, seed=2))
    parent = manifest_of(old, 1)
    encode_patch([old / "model.safetensors"], [decoy / "model.safetensors"], new / "model.patch")  # the wrong one
    child = manifest_of(new, 2, PatchRef(parent.id, 1, "model.patch"))
    async with origin_and_peer(tmp_path, key, [(parent, old), (child, new)]) as (nursery, origin, peer, s_peer):
        await fetched(nursery, peer, origin, signed(parent, key))
        policy = await fetched(nursery, peer, origin, signed(child, key))
        assert s_peer.file_path(child, "model.safetensors").read_bytes() == (new / "model.safetensors").read_bytes()
        both = (new / "model.patch").stat().st_size + (new / "model.safetensors").stat().st_size
        assert bytes_down(policy) == both
        assert "cannot be applied" in caplog.text and "signed hash" in caplog.text
        assert not list(s_peer.rebuild_dir().iterdir())  # nothing of the bad rebuild is kept


async def test_a_patch_naming_a_parent_this_peer_lacks_is_fetched_whole(tmp_path):
    key = Identity.generate()
    parent, child, old, new = parent_and_child(tmp_path)
    async with origin_and_peer(tmp_path, key, [(parent, old), (child, new)]) as (nursery, origin, peer, _):
        policy = await fetched(nursery, peer, origin, signed(child, key))
        assert policy.parent is None
        assert bytes_down(policy) == (new / "model.safetensors").stat().st_size
