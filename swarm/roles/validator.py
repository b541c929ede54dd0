"""The validator role: check the rollouts assigned to this peer and gossip signed votes.

A validator holds a model for every policy version inside the async window (weights swapped in from the verified
pieces), takes each version's validator set from the trainer's signed manifest, and checks a rollout only when
rendezvous hashing assigns it here, so no worker can choose its validators. Rollouts are checked in batches (one
batched prefill per version), which is what keeps validation far cheaper than generation. Every verdict then
passes through the worker's near-tie history (verify/worker_history.py): its vote carries the group's flips, and a
worker whose flips over all the groups checked here exceed the honest rate is banned, its group rejected with the
reason `near_ties`, and its later groups no longer fetched.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING

import trio

from swarm.event_types import RejectedRollout, RewardRefused, Validated, ValidatorDevice, WorkerBanned
from swarm.messages.votes import vote_bodies
from swarm.node.context import RoleContext
from swarm.policy.files import VersionUnusable, load_base_model, open_version
from swarm.policy.runspec import RunSpec, VersionTasks
from verify.provider import TaskSetProvider
from verify.reputation import Reputation
from verify.rollout import RolloutGroup
from verify.slots import SlotLedger, first_answers
from verify.votes import assign_validators, vote_from_verdict

if TYPE_CHECKING:
    import torch
    from torch import nn

    from inference.models import LoadedModel
    from swarm.messages.rollout_codec import Announcement
    from swarm.policy.mirrored import MirroredPolicy
    from verify.checks import CheckConfig, RunContext
    from verify.verdicts import Verdict
    from verify.worker_history import WorkerHistory

log = logging.getLogger(__name__)
BATCH_WINDOW_S = 0.5
MAX_BATCH = 64
MAX_WAITING = 1024


class VersionModels:
    """One model per policy version inside the window, built from the base model and the version's weights and
    placed on `device` (the base model itself stays on the CPU: it is only ever copied)."""

    def __init__(self, loaded: LoadedModel, device: torch.device | None = None) -> None:
        self.loaded = loaded
        self.device = device
        self.models: dict[int, nn.Module] = {}
        self.specs: dict[int, RunSpec] = {}
        self.policies: dict[int, MirroredPolicy] = {}
        self.tasks: dict[int, VersionTasks] = {}
        self.refused_rewards: set[tuple[str, str]] = set()  # (reward, hash) this peer said once it cannot score

    async def sync(self, ctx: RoleContext[None]) -> None:
        from inference.weights import load_weights_in_place

        for policy in ctx.mirror.complete_versions():
            version = policy.manifest.version
            if version in self.models:
                continue
            try:
                spec = RunSpec.from_model(policy.manifest.model)
            except Exception as exc:  # noqa: BLE001 - a version without a usable spec cannot be validated
                log.warning("version %d has no usable run spec: %s", version, exc)
                continue
            if self.refuses_reward(ctx, spec):
                continue
            model = copy.deepcopy(self.loaded.model)
            try:
                async with open_version(ctx.mirror, spec, policy) as (directory, tasks):
                    await trio.to_thread.run_sync(load_weights_in_place, model, directory)
            except VersionUnusable as exc:  # it left the window (a newer one is there) or its tasks are unreadable
                log.warning("version %d cannot be validated: %s", version, exc)
                continue
            if self.device is not None:
                model = await trio.to_thread.run_sync(model.to, self.device)
            self.models[version], self.specs[version], self.policies[version] = model, spec, policy
            self.tasks[version] = tasks
        newest = max(self.models, default=-1)
        for version in [v for v in self.models if newest in self.specs and v < newest - self.specs[newest].async_level]:
            for table in (self.models, self.specs, self.policies, self.tasks):
                table.pop(version, None)


    def refuses_reward(self, ctx: RoleContext[None], spec: RunSpec) -> bool:
        """Whether this validator lacks the run's own reward as the spec hashes it; said once per reward, since a
        vote on rewards computed by other code would reject honest work."""
        problem = spec.reward_problem()
        if problem and (spec.reward, spec.reward_hash) not in self.refused_rewards:
            self.refused_rewards.add((spec.reward, spec.reward_hash))
            ctx.events.emit(RewardRefused(reward=spec.reward, expected=spec.reward_hash, message=(
                f"refusing to vote on run {ctx.peer.run}: {problem}")))
        return bool(problem)


def assigned_to_me(slot_key: bytes, worker: str, spec: RunSpec, my_key: bytes) -> bool:
    """Whether rendezvous hashing of the group's slot assigns it to this validator (never its own worker's)."""

    return my_key in assign_validators(slot_key, spec.validators_for(worker), spec.replicas)


def _context(ctx: RoleContext[None], models: VersionModels, version: int, loaded: LoadedModel) -> RunContext:
    from verify.checks import RunContext

    spec, policy, tasks = models.specs[version], models.policies[version], models.tasks[version]
    train = tasks.train
    return RunContext(
        run=ctx.peer.run, current_version=max(models.models), async_window=spec.async_level,
        manifest_ids={v: p.manifest.id for v, p in models.policies.items()},
        max_new_tokens=policy.manifest.generation.max_new_tokens, dataset=train.name,
        eligible=tasks.eligible, prompts_per_step=tasks.prompts_per_worker, eos_ids=loaded.eos_token_ids,
        tasks=TaskSetProvider({train.name: train}, loaded.tokenizer),
        temperature=policy.manifest.generation.temperature, group_size=policy.manifest.generation.group_size)


def check_config(spec: RunSpec) -> CheckConfig:
    """The validator's tolerances: those of the run's precision, except the EOS-probability floor.

    Why: INTELLECT-2 required P(EOS) > 0.1 because it could not check how tokens were sampled. Our seeded
    Gumbel-max sampler lets the sampling check re-derive every token, the final EOS included, which proves the
    EOS was honestly sampled; the floor on top only rejected honest high-temperature samples (seen in the
    simulation: an honest tiny-model EOS sampled at p = 0.005).
    """
    from verify.checks import CheckConfig

    return CheckConfig.for_precision(spec.precision, min_eos_prob=0.0)


def _verify_batch(ctx: RoleContext[None], models: VersionModels, loaded: LoadedModel,
                  groups: list[RolloutGroup]) -> list[Verdict]:
    """Blocking: one verdict per group, grouped by version so each context matches its version's stage."""
    from verify.checks import CheckResult
    from verify.verifier import Verdict, verify_groups

    verdicts = []
    for version in sorted({g.policy_version for g in groups}):
        batch = [g for g in groups if g.policy_version == version]
        for g, verdict in zip(batch, verify_groups(models.models, batch, _context(ctx, models, version, loaded),
                                                check_config(models.specs[version]))):
            if g.step != g.policy_version:  # a worker may not shop for easier prompts under another step
                verdict = Verdict(verdict.rollout_id, False, verdict.checks + (
                    CheckResult("step", False, "assignment step differs from the policy version"),))
            verdicts.append(verdict)
    return verdicts


class NearTieHistories:
    """This validator's near-tie history of every worker (verify/worker_history.py), one per precision a version
    names, since each precision has its own honest flip rate; and the bans it shares with the reputation."""

    def __init__(self, reputation: Reputation) -> None:
        self.reputation = reputation
        self.by_precision: dict[str, WorkerHistory] = {}

    def of(self, precision: str) -> WorkerHistory:
        from verify.worker_history import HistoryConfig, WorkerHistory

        if precision not in self.by_precision:
            self.by_precision[precision] = WorkerHistory(HistoryConfig.for_precision(precision))
        return self.by_precision[precision]

    def is_banned(self, worker: str) -> bool:
        """Banned by this validator's reputation of it or by its near-tie history."""
        return self.reputation.is_banned(worker) or any(h.is_banned(worker) for h in self.by_precision.values())

    def judge(self, verdicts: list[Verdict], group_of: dict[bytes, RolloutGroup], models: VersionModels,
              ctx: RoleContext[None]) -> list[Verdict]:
        """Each verdict with its `near_ties` row (verify.worker_history.judge_verdict); a worker banned by its
        history is reported once, with the reason."""
        from verify.worker_history import judge_verdict

        out = []
        for verdict in verdicts:
            group = group_of[verdict.rollout_id]
            history = self.of(models.specs[group.policy_version].precision)
            verdict, judgement = judge_verdict(history, group.worker, verdict)
            if judgement is not None and judgement.newly_banned:
                log.warning("banned worker %s: %s", group.worker, judgement.reason)
                ctx.events.emit(WorkerBanned(worker=group.worker, reason=judgement.reason))
            out.append(verdict)
        return out


def wants_announced(models: VersionModels, workers: NearTieHistories | Reputation, my_key: bytes
                    ) -> Callable[[Announcement], bool]:
    """Whether to fetch an announced group: not from a worker this validator banned, and assigned here when the
    version's validator set is already known (an unknown version is fetched: its files may still be arriving)."""

    def wanted(ann: Announcement) -> bool:
        if workers.is_banned(ann.worker):
            return False
        spec = models.specs.get(ann.policy_version)
        return spec is None or assigned_to_me(ann.slot().key(), ann.worker, spec, my_key)

    return wanted


async def validator_role(ctx: RoleContext[None]) -> None:
    from inference.select import resolve_device
    from swarm.messages.rollout_transport import receive_groups

    # Listen before loading the model: the trainer names this validator in a version as soon as its heartbeat is
    # heard, and that version's rollouts, gossiped while the model loaded, were otherwise lost here for good (seen
    # with three processes: a validator that joined late held up the version's rollouts for the 120 s quorum
    # timeout). The channel holds them until the model is ready.
    rollouts = ctx.gossip.subscribe("rollout")
    device = resolve_device(ctx.peer.device)
    loaded = await load_base_model(ctx.peer.model)
    models = VersionModels(loaded, device)
    ctx.events.emit(ValidatorDevice(device=str(device), message=f"prefills run on {device}"))
    my_key = ctx.identity.public_bytes
    workers = Reputation()  # this validator's own verdicts; a worker it bans is no longer checked
    slots = SlotLedger()  # one rollout per slot: a second group for one is refused unchecked (verify.slots)
    send, receive = trio.open_memory_channel(MAX_WAITING)
    histories = NearTieHistories(workers)  # and each worker's near-tie flips over every group checked here
    stats = {"checked": 0, "accepted": 0, "rejected": 0, "skipped_banned": 0}

    def collect(group: RolloutGroup) -> None:
        """Queue a received group (inline, compressed, or announced and fetched) unless its worker is banned; a
        refused one never gets here: the trainer refuses it too, nobody waits for a vote on it."""
        if histories.is_banned(group.worker):
            stats["skipped_banned"] += 1
            return
        try:
            send.send_nowait(group)
        except trio.WouldBlock:
            log.warning("validator queue full; dropping a rollout")

    async with trio.open_nursery() as nursery:
        nursery.start_soon(partial(receive_groups, ctx, rollouts, collect,
                                   wanted=wants_announced(models, histories, my_key)))
        waiting: list = []
        while True:
            # Wake at least every second: rollouts may have arrived before their version finished downloading
            # here, and they must be checked once it has, even if no further rollout ever comes.
            with trio.move_on_after(1.0):
                waiting.append(await receive.receive())
            with trio.move_on_after(BATCH_WINDOW_S):
                while len(waiting) < MAX_BATCH:
                    waiting.append(await receive.receive())
            if not waiting:
                continue
            await models.sync(ctx)
            ready = [g for g in waiting if g.policy_version in models.models]
            waiting = [g for g in waiting if g.policy_version not in models.models
                       and g.policy_version > max(models.models, default=-1)][:MAX_WAITING]
            mine = [g for g in ready
                    if assigned_to_me(g.slot().key(), g.worker, models.specs[g.policy_version], my_key)]
            if not mine:
                continue
            slots.forget_below(max(models.models) - models.specs[max(models.models)].async_level)
            fresh, repeated = first_answers(slots, mine)
            verdicts = await trio.to_thread.run_sync(_verify_batch, ctx, models, loaded, fresh) + repeated
            worker_of = {g.rollout_id(): g.worker for g in mine}  # verdicts come back ordered by version
            verdicts = histories.judge(verdicts, {g.rollout_id(): g for g in mine}, models, ctx)
            for body in vote_bodies(vote_from_verdict(ctx.identity.seed, v) for v in verdicts):
                await ctx.gossip.publish("vote", body)  # the batch's votes in as few messages as fit
            for verdict in verdicts:
                workers.record(worker_of[verdict.rollout_id], verdict.accepted)
                stats["checked"] += 1
                stats["accepted" if verdict.accepted else "rejected"] += 1
                if not verdict.accepted:
                    ctx.events.emit(RejectedRollout(reason=verdict.reason))
            ctx.events.emit(Validated(**stats))
