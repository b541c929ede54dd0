"""The inference role: follow the newest policy, answer the prompts the run assigns this peer, publish rollouts.

Assignment step = policy version: for every version it holds, a worker answers exactly the prompts
`assign_tasks(run, its peer id, version, eligible, prompts_per_worker)` names, sampling with the seeded Gumbel-max
keys validators re-derive, and attaches a TOPLOC proof to every completion. It then waits for a newer version
(async: the trainer may already be training on an older one). A slot it published before a restart is never
answered again (inference.published): a second group for a slot costs its worker, whatever its bytes.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import trio

from inference.published import PublishedSlots
from p2p.errors import P2PError
from swarm.config import InferenceSection, PeerSection
from swarm.event_types import Generated, Generating, Skipped
from swarm.messages.rollout_codec import BlobCache, RolloutRefused
from swarm.node.context import RoleContext
from swarm.policy.files import VersionUnusable, load_base_model, newest_complete, open_version
from swarm.policy.mirrored import MirroredPolicy
from swarm.policy.policy_patches import changed_tensors
from swarm.policy.runspec import RunSpec, VersionTasks
from tasks.assignment import assign_tasks
from verify.rollout import RolloutGroup, Slot

if TYPE_CHECKING:
    from inference.backend import GenerationBackend
    from inference.models import LoadedModel

log = logging.getLogger(__name__)


Tamper = Callable[[list[RolloutGroup]], list[RolloutGroup]]
"""What a worker does to its groups before publishing them (the simulation's cheater rewrites their rewards)."""


def unchanged(groups: list[RolloutGroup]) -> list[RolloutGroup]:
    """What an honest worker does to its groups before publishing them: nothing."""
    return groups


async def inference_role(ctx: RoleContext[InferenceSection], tamper: Tamper = unchanged) -> None:
    """`tamper` rewrites each version's groups before they are recorded and published: `unchanged` here; the
    simulation's cheater (swarm.sim.cheater) passes one that lies about its rewards."""
    from inference.select import open_backend
    from swarm.messages.rollout_transport import serve_rollout_blobs

    published = PublishedSlots.load(published_slots_path(ctx.peer))  # before anything: an unreadable one stops
    blobs = serve_rollout_blobs(ctx.host)  # groups too large for gossip are announced and served from here
    loaded = await load_base_model(ctx.peer.model)
    backend = None  # opened with the first version: the run's manifest names the precision to generate in
    done = -1
    while True:
        policy = await newest_complete(ctx.mirror, done)
        done = policy.manifest.version
        try:
            spec = RunSpec.from_model(policy.manifest.model)
        except Exception as exc:  # noqa: BLE001 - a malformed spec skips this version, it does not stop the peer
            ctx.events.emit(Skipped(version=done, message=str(exc)))
            continue
        why = unanswerable(spec, ctx.peer_id, done)
        if why:
            ctx.events.emit(Skipped(version=done, message=why))
            continue
        if backend is None:  # vLLM takes minutes to start
            backend = await trio.to_thread.run_sync(open_backend, ctx.settings.backend, loaded, spec.precision,
                                                    ctx.settings.gpu_memory)
        try:
            async with open_version(ctx.mirror, spec, policy) as (directory, tasks):
                # Said before the long blocking call, so a watchdog can tell "generating" from "waiting for a version".
                ctx.events.emit(Generating(version=done, prompts=spec.prompts_per_worker))
                changed = changed_tensors(ctx.mirror.policies.get(backend.manifest_id), policy.manifest)
                groups = await trio.to_thread.run_sync(_generate, ctx.peer.run, ctx.peer_id, backend, loaded,
                                                       policy, tasks, directory, published, spec.async_level, tamper,
                                                       changed)
        except VersionUnusable as exc:  # skipped, not fatal
            ctx.events.emit(Skipped(version=done, message=str(exc)))
            continue
        if not groups:
            ctx.events.emit(Skipped(version=done, message="every slot of this version was published before"))
            continue
        await _publish_groups(ctx, groups, blobs)
        ctx.events.emit(Generated(version=done, groups=len(groups),
                                   completions=sum(len(g.completions) for g in groups),
                                   tokens=sum(len(c.tokens) for g in groups for c in g.completions),
                                   mean_reward=round(sum(c.reward for g in groups for c in g.completions)
                                                     / max(1, sum(len(g.completions) for g in groups)), 3)))


def unanswerable(spec: RunSpec, worker: str, version: int) -> str:
    """Why this worker's rollouts of `version` could never be accepted (then it does not generate them), or "".

    The trainer never publishes a version naming fewer validators than its quorum, but a peer that also validates
    is never assigned its own rollouts, so for it a version may still be one validator short."""
    if spec.quorum_reachable(worker):
        return ""
    return (f"v{version} names {len(spec.validators)} validators and its quorum needs {spec.quorum} other than this "
            f"peer (no peer validates its own rollouts): its rollouts could not be accepted, so it skips the version")


def published_slots_path(peer: PeerSection) -> Path:
    """Where a worker keeps the slots it published in `peer.run` (inference.published)."""
    return Path(peer.data_dir) / f"published-slots-{peer.run}.json"


def _generate(run: str, worker: str, backend: GenerationBackend, loaded: LoadedModel, policy: MirroredPolicy,
              tasks: VersionTasks, directory: Path | str, published: PublishedSlots, async_level: int,
              tamper: Tamper = unchanged,
              changed: frozenset[str] | None = None) -> list[RolloutGroup]:
    """Blocking: swap weights, generate this worker's assigned groups it has not published yet, with proofs, and
    record their slots in `published` before they are returned for publishing (a crash after this loses the
    groups' work, never answers a slot twice). Of its peer the thread reads only the run and its own id, `worker`."""
    from inference.rollouts import build_rollout_group, make_request

    manifest = policy.manifest
    step = manifest.version
    assigned = [tasks.train[i] for i in assign_tasks(run, worker, step, tasks.eligible, tasks.prompts_per_worker)]
    slot_of = {e.index: Slot(run, manifest.version, worker, step, e.dataset, e.index) for e in assigned}
    fresh = published.unpublished(list(slot_of.values()))
    entries = [e for e in assigned if slot_of[e.index] in fresh]
    if not entries:
        return []
    backend.load_policy(str(directory), version=manifest.version, manifest_id=manifest.id, changed=changed)
    gen = manifest.generation
    requests = [make_request(loaded.tokenizer, e, run=run, worker=worker, step=step, group_size=gen.group_size,
                             temperature=gen.temperature, max_new_tokens=gen.max_new_tokens) for e in entries]
    results = backend.generate(requests)
    groups = tamper([build_rollout_group(r, e, loaded.tokenizer, run=run, worker=worker, step=step)
                     for r, e in zip(results, entries)])
    published.record([g.slot() for g in groups], floor=manifest.version - async_level)
    return groups


async def _publish_groups(ctx: RoleContext[InferenceSection], groups: list[RolloutGroup], blobs: BlobCache) -> None:
    """Gossip this version's groups, several to a message: inline (compressed when that helps) or announced by hash
    and served from `blobs`."""
    from swarm.messages.rollout_transport import publish_groups

    def skipped(group: RolloutGroup, exc: RolloutRefused) -> None:
        ctx.events.emit(Skipped(message=f"rollout group for task {group.task_index} not published: {exc}"))

    try:
        await publish_groups(ctx, groups, blobs, skipped=skipped)
    except P2PError as exc:
        log.warning("rollouts not published: %s", exc)
