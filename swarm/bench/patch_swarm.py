"""The swarm side of `swarm bench patch`: a version's broadcast as a patch against as a full copy, and what a peer
that lacks the parent fetches to catch up.

The broadcast runs the real piece protocol in virtual time (swarm.bench.broadcast_virtual) at one upload cap for
the seed and every peer, once per form, with policies of the measured byte counts (piece contents do not change a
transfer's time). Catching up runs the real mirrors of an origin, a peer that follows every version and a late
peer over in-memory streams: the follower fetches the patch and rebuilds the version, the late peer fetches it from
the follower in full.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import trio
import trio.testing

from p2p.identity import Identity
from p2p.pieces.manifest import GenerationSettings, PatchRef, PolicyManifest, build_manifest, sign_manifest
from p2p.pieces.patch import encode_patch, tensor_index
from p2p.pieces.store import PieceStore
from swarm.bench.broadcast_virtual import VirtualSwarm, make_virtual_policy, simulate_virtual_broadcast
from swarm.policy.mirror import PolicyMirror
from swarm.policy.mirrored import MirroredPolicy
from swarm.policy.trust import TrainerTrust

PIECE = 1 << 20
RUN = "bench-patch"


def broadcast_costs(versions: list[Path], peers: int, upload_bps: float, work: Path) -> dict:
    """Seconds to broadcast the newest version to `peers` as its patch, as a bf16 copy and as a float32 copy."""
    work.mkdir(parents=True)
    encode_patch([versions[-2]], [versions[-1]], work / "model.patch")
    bf16 = versions[-1].stat().st_size
    data = sum(spot.nbytes for _, spot in tensor_index([versions[-1]]).values())
    sizes = {"patch": (work / "model.patch").stat().st_size, "bf16": bf16, "float32": bf16 + data}
    shape = VirtualSwarm(peers=peers, degree=min(8, peers), seed_upload_bps=upload_bps, peer_upload_bps=upload_bps)
    seconds = {}
    for form, size in sizes.items():
        manifest = make_virtual_policy(work / form, size, piece_size=PIECE)
        result = trio.run(simulate_virtual_broadcast, manifest, work / form, shape,
                          clock=trio.testing.MockClock(autojump_threshold=0))
        seconds[form] = round(result.seconds, 2)
        shutil.rmtree(work / form)
    return {"peers": peers, "upload_mbps": round(upload_bps * 8 / 1e6, 1), "bytes": sizes, "seconds": seconds,
            "patch_vs_bf16_time": round(seconds["bf16"] / seconds["patch"], 1),
            "patch_vs_float32_time": round(seconds["float32"] / seconds["patch"], 1)}


def version_dirs(versions: list[Path], work: Path, key: Identity) -> list[tuple[Path, PolicyManifest, bytes]]:
    """The newest two versions as published directories: the older a keyframe, the newer a patch over it."""
    out = []
    for number, weights in enumerate(versions[-2:], start=1):
        directory = work / f"v{number}"
        directory.mkdir(parents=True)
        shutil.copyfile(weights, directory / "model.safetensors")
        (directory / "model.json").write_text(json.dumps({"architecture": "bench"}))
        patch = None
        if out:
            encode_patch([out[-1][0] / "model.safetensors"], [directory / "model.safetensors"],
                         directory / "model.patch")
            patch = PatchRef(out[-1][1].id, number - 1, "model.patch")
        manifest = build_manifest(directory, run=RUN, version=number, parent_version=number - 1 or None,
                                  created_at=0.0, generation=GenerationSettings(1, 1.0, 1, 0), piece_size=PIECE,
                                  patch=patch)
        out.append((directory, manifest, sign_manifest(manifest, key.sign, key.public_bytes).to_bytes()))
    return out


async def fetch_over_memory(follower: PolicyMirror, source: PolicyMirror, signed: bytes) -> MirroredPolicy:
    """`follower` adopts a signed version and links to `source` for it (the follower dials: its id must be the
    smaller); returns once it
    holds the version's full files."""
    policy = follower.adopt(signed)
    ours, theirs = trio.testing.memory_stream_pair()

    async def dial(peer: str):
        return ours

    async with trio.open_nursery() as nursery:
        nursery.start_soon(source.accept_link, follower.my_id, theirs)
        nursery.start_soon(follower.outbound._dial_link, policy, source.my_id, dial)
        with trio.fail_after(300):
            await policy.ready.wait()
        nursery.cancel_scope.cancel()
    return policy


def bytes_down(policy: MirroredPolicy) -> int:
    return sum(policy.service.progress().bytes_down.values())


def catch_up_bytes(versions: list[Path], work: Path) -> dict:
    """Bytes a follower (holding the parent) and a late peer (holding nothing) fetch for the newest version."""
    key = Identity.generate()
    (parent_dir, parent, parent_signed), (child_dir, child, child_signed) = version_dirs(versions, work, key)

    async def main() -> dict:
        stores = {name: PieceStore(work / f"store-{name}") for name in ("b-origin", "a-follower", "a-catching-up")}
        mirrors = {name: PolicyMirror(store, name, TrainerTrust(RUN, key.public_bytes, work / name), run=RUN)
                   for name, store in stores.items()}
        try:
            async with trio.open_nursery() as nursery:
                for mirror in mirrors.values():
                    await nursery.start(mirror.run_service)
                origin, follower, late = mirrors.values()
                origin.adopt(parent_signed, local_dir=parent_dir)
                origin.adopt(child_signed, local_dir=child_dir)
                await fetch_over_memory(follower, origin, parent_signed)
                patched = await fetch_over_memory(follower, origin, child_signed)
                caught_up = await fetch_over_memory(late, follower, child_signed)
                nursery.cancel_scope.cancel()
        finally:
            for store in stores.values():
                store.close()
        full = child.full_size()
        return {"full_copy_bytes": full, "follower_bytes": bytes_down(patched),
                "late_peer_bytes": bytes_down(caught_up),
                "late_peer_vs_full_copy": round(bytes_down(caught_up) / full, 3)}

    try:
        return trio.run(main)
    finally:
        shutil.rmtree(work, ignore_errors=True)
