"""A node's upload cap means its whole upload, however the node serves its versions.

Why a test of its own: a node serves every version in its window at once, each with a service of its own. The cap
(`--upload-mbps`) is one TokenBucket the node hands to every service, through `run_swarm` as through the policy
mirror; a cap that meant one version's upload on either path would let a node with three versions upload three
times what its operator allowed, and the two timings below would differ.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import trio
import trio.testing

from p2p.identity import Identity
from p2p.memnet import MemoryNetwork
from p2p.pieces.manifest import MIN_PIECE_SIZE, PolicyManifest, build_manifest, sign_manifest
from p2p.pieces.store import PieceStore
from p2p.pieces.transfer import SwarmService, run_swarm
from p2p.ratelimit import TokenBucket
from swarm.policy.mirror import PolicyMirror
from swarm.policy.trust import TrainerTrust
from tests.test_p2p_transfer import GEN, MB, make_policy

CAP = MB // 2  # bytes/s: the seed node's whole upload
VERSIONS = (1, 2)


def signed_versions(tmp_path, key: Identity) -> list[tuple[PolicyManifest, bytes, Path]]:
    """Two versions of 1 MiB each, signed by `key`: (manifest, signed bytes, policy directory)."""
    out = []
    for version in VERSIONS:
        directory = tmp_path / f"src{version}"
        make_policy(directory, 1 * MB, seed=version)
        manifest = build_manifest(directory, run="r", version=version, parent_version=version - 1, created_at=0.0,
                                  generation=GEN, piece_size=MIN_PIECE_SIZE)
        out.append((manifest, sign_manifest(manifest, key.sign, key.public_bytes).to_bytes(), directory))
    return out


async def serve_through_run_swarm(nursery, store, versions, tmp_path) -> list[SwarmService]:
    """One `run_swarm` per version, all given the node's one bucket."""
    bucket, services = TokenBucket(CAP), []
    for manifest, _, directory in versions:
        store.add_local_policy(manifest, directory)
        _, links = trio.open_memory_channel(0)
        services.append(await nursery.start(lambda task_status, m=manifest, ch=links: run_swarm(
            m, store, ch, role="seed", upload_bucket=bucket, task_status=task_status)))
    return services


async def serve_through_the_mirror(nursery, store, versions, tmp_path) -> list[SwarmService]:
    """The policy mirror a peer runs, given the node's cap as `upload_bps`."""
    trust = TrainerTrust("r", None, tmp_path)  # the first signer is trusted
    mirror = PolicyMirror(store, "seed", trust, run="r", upload_bps=CAP, keep=len(versions))
    await nursery.start(mirror.run_service)
    services = [mirror.adopt(signed, local_dir=directory).service for _, signed, directory in versions]
    await trio.testing.wait_all_tasks_blocked()  # the mirror starts each version's service in its own nursery
    return services


@pytest.mark.parametrize("serve", [serve_through_run_swarm, serve_through_the_mirror], ids=["run_swarm", "mirror"])
async def test_a_node_serving_two_versions_uploads_at_its_cap_in_total(tmp_path, autojump_clock, serve):
    versions = signed_versions(tmp_path, Identity.generate())
    net = MemoryNetwork()
    net.add_node("seed")
    stores = [PieceStore(tmp_path / "seed-store")]
    async with trio.open_nursery() as nursery:
        seeds = await serve(nursery, stores[0], versions, tmp_path)
        start, fetchers = trio.current_time(), []
        for version, seed in zip(VERSIONS, seeds):
            stores.append(PieceStore(tmp_path / f"p{version}"))
            fetcher = SwarmService(seed.manifest, stores[-1], rng=random.Random(version))
            await nursery.start(fetcher.run)
            net.add_node(f"p{version}")
            a, b = net.connect("seed", f"p{version}")
            seed.add_link(f"p{version}", a)
            fetcher.add_link("seed", b)
            fetchers.append(fetcher)
        for fetcher in fetchers:
            await fetcher.completed.wait()
        elapsed = trio.current_time() - start
        nursery.cancel_scope.cancel()
    for store in stores:
        store.close()
    expected = sum(seed.manifest.total_size for seed in seeds) / CAP  # both versions through one cap
    assert expected - 0.2 <= elapsed <= expected * 1.1
