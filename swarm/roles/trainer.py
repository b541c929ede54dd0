"""The trainer role: quorum-accepted rollouts in, GRPO steps, every new policy version signed and seeded.

The trainer's node identity is the run's trainer key, so the manifests it signs name it as their origin. What the
network decides lives in `RolloutGate` (swarm.roles.gate), a sans-IO object (rollouts and votes in, accepted
groups out) tested without sockets; this module only moves data between gossip, the gate and the training run.
"""

from __future__ import annotations

import functools
import logging
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING

import trio

from swarm.config import PeerSection, TrainerRoleSection, TrainerSettings
from swarm.event_types import (
    Evaluated,
    Gate,
    NumberedPast,
    PublishingEarly,
    Resumed,
    Trained,
    TrainerDevice,
    TrainStep,
    WorkerBanned,
)
from swarm.messages.gossip_bodies import VoteBatch
from swarm.node.context import RoleContext
from swarm.policy.runspec import RunSpec
from swarm.policy.task_file import RunTaskFile, snapshot_task_file
from swarm.roles.batch_wait import BatchWait, GateCounts, SwarmFacts, why_publish_now
from swarm.roles.gate import RolloutGate
from swarm.roles.trainer_publisher import SwarmPublisher
from tasks.prompts import decode_completion
from trainer.config import TrainerConfig
from trainer.config import load_config as load_trainer_config
from trainer.curriculum import Curriculum
from trainer.step_record import StepRecord
from trainer.tracking import gate_scalars
from verify.rollout import RolloutGroup

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from inference.models import LoadedModel
    from trainer.loop import TrainingRun
    from trainer.session import Evaluator

log = logging.getLogger(__name__)
TrainerContext = RoleContext[TrainerSettings]


def _with_task_file_snapshot(cfg: TrainerConfig, peer: PeerSection, piece_kb: int
                             ) -> tuple[TrainerConfig, RunTaskFile | None]:
    """(cfg, RunTaskFile or None): with a task file, the run's snapshot of it, and a config that trains on those
    very bytes, which every version carries to the peers (swarm.policy.task_file)."""
    task_file = snapshot_task_file(cfg.task, Path(peer.data_dir) / "swarm-policies" / "task-file",
                                   piece_kb * 1024, cfg.prompt_key, cfg.answer_key)
    if task_file is None:
        return cfg, None
    update = {"task": str(task_file.path), "prompt_key": "prompt", "answer_key": "answer"}
    return cfg.model_copy(update=update), task_file


def load_role_config(peer: PeerSection, section: TrainerRoleSection) -> tuple[TrainerConfig, Curriculum]:
    """(TrainerConfig, curriculum) of the trainer role: its --trainer-config file with the peer's run, model and
    data directory filled in."""

    loaded = load_trainer_config(section.config, {"run": peer.run, "model": peer.model,
                                                  "out": Path(peer.data_dir) / "training",
                                                  "report_to": section.report_to or None})
    return loaded.config, loaded.curriculum


async def trainer_role(ctx: TrainerContext) -> None:
    """Train on quorum-accepted rollouts until the configured steps are done (or the time limit passes), publishing
    every new version."""
    from swarm.messages.rollout_transport import receive_groups

    section = ctx.settings.trainer
    cfg, curriculum = load_role_config(ctx.peer, section)
    cfg, task_file = await trio.to_thread.run_sync(_with_task_file_snapshot, cfg, ctx.peer, ctx.settings.piece_kb)
    run = await _start_training_run(ctx, cfg, curriculum)
    publisher = SwarmPublisher(ctx, cfg, task_file)
    gate = _open_gate(ctx.peer.run, section, cfg, run, publisher)
    rollout_envelopes, vote_envelopes = ctx.gossip.subscribe("rollout"), ctx.gossip.subscribe("vote")  # before
    # the first version goes out: nothing its workers and validators send may pass before the trainer listens
    evaluator = await trio.to_thread.run_sync(_open_evaluator, run, cfg, curriculum)
    heldout: dict[str, float] = {}
    await _first_version(ctx, run, publisher, gate, evaluator, heldout)
    progress = trio.Event()
    reported_bans: set[str] = set()

    def report_reputation_bans() -> None:
        _report_reputation_bans(ctx, gate, reported_bans)

    def on_rollout(group: RolloutGroup) -> None:
        """A received group (inline, compressed, or announced and fetched); refusals (a group of another worker
        than its sender included) never get here: receive_groups counts and logs them."""
        gate.on_rollout(group, trio.current_time())
        report_reputation_bans()  # a second group for a taken slot counts against its worker too
        progress.set()

    async def rollouts() -> None:
        await receive_groups(ctx, rollout_envelopes, on_rollout,
                             refused=lambda why: gate.count(f"refused:{why}"))

    async def votes() -> None:
        async for env in vote_envelopes:  # gossip's validator decoded the batch: every vote parsed, signed and
            for vote in env.decoded(VoteBatch).votes:  # sent by its own validator (gossip_bodies.decode_votes)
                gate.on_vote(vote, trio.current_time())
            report_reputation_bans()
            for worker, reason in gate.take_new_bans():  # reported once, when its near-ties cross the test
                ctx.events.emit(WorkerBanned(worker=worker, by="near_ties", reason=reason))
            progress.set()

    async def ticks() -> None:
        last = None
        while True:
            await trio.sleep(1.0)
            gate.on_validators({bytes.fromhex(k) for k in publisher.known_validators()}, trio.current_time())
            gate.tick(trio.current_time())
            gate.forget_old(trio.current_time())
            progress.set()
            if gate.counts != last:  # what the gate has seen so far, for the status view and the report
                last = dict(gate.counts)
                ctx.events.emit(Gate(waiting=len(gate.pending), ready=len(gate.accepted), counts=last))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(rollouts)
        nursery.start_soon(votes)
        nursery.start_soon(ticks)
        while run.wants_step(cfg.steps):  # the configured steps, within time_limit_min when one is set
            waiting = BatchWait(cfg.prompts_per_step, trio.current_time())
            # decisions read what was just counted (a stale count once published instead of training)
            while not waiting.ready(counts := gate_counts(gate, publisher.known_workers()), trio.current_time()):
                await _publish_when_stuck(ctx, run, publisher, gate, waiting, counts)
                if waiting.should_report(trio.current_time()):
                    ctx.events.emit(waiting.status(counts, trio.current_time()))
                with trio.move_on_after(1.0):
                    await progress.wait()
                    progress = trio.Event()
            batch = gate.take(cfg.prompts_per_step)
            gate.keep_in(run.state.extra, due=(run.state.step + 1) % cfg.checkpoint_every == 0)  # with checkpoints
            record = await trio.to_thread.run_sync(run.step, batch)
            ctx.events.emit(_step_event(record, batch, gate, run.loaded.tokenizer))
            run.tracker.log(gate_scalars(gate.counts), record.step + 1)  # beside the step's own figures
            await _publish_newest(run, publisher, gate)
            if cfg.eval_every and run.state.step % cfg.eval_every == 0 and run.wants_step(cfg.steps):
                await _evaluate(ctx, evaluator, run, heldout, "during")
        await _finish_training(ctx, run, evaluator, gate, heldout)
        nursery.cancel_scope.cancel()
    if section.exit_when_trained:
        ctx.done.set()


def _open_gate(run_name: str, section: TrainerRoleSection, cfg: TrainerConfig, run: TrainingRun,
               publisher: SwarmPublisher) -> RolloutGate:
    """The run's gate, with the judgements of the checkpoint resumed (if any); the validators it bans leave the
    publisher's next versions."""
    gate = RolloutGate(run_name, section.replicas, section.quorum, section.quorum_timeout_s,
                       async_level=cfg.async_level)
    publisher.excluded = gate.validator_banned
    gate.restore(run.state.extra.get("gate"))
    return gate


def _report_reputation_bans(ctx: TrainerContext, gate: RolloutGate, reported: set[str]) -> None:
    """A worker the reputation rule banned (its rollouts rejected by the quorum) is reported once, with why."""
    for worker in sorted({w for w in gate.reputation.banned() if isinstance(w, str)} - reported):
        reported.add(worker)
        ctx.events.emit(WorkerBanned(worker=worker, by="reputation", reason=(
            f"the validators' quorum rejected its rollouts until its reputation fell to "
            f"{gate.reputation.score(worker):.1f} (banned at {gate.reputation.config.ban_below:g} or below)")))


async def _finish_training(ctx: TrainerContext, run: TrainingRun, evaluator: Evaluator, gate: RolloutGate,
                           heldout: dict[str, float]) -> None:
    """Save the final policy, score it on the held-out split, close the trackers and say what was trained."""
    gate.keep_in(run.state.extra, due=True)  # the final checkpoint carries the gate's judgements too
    final = await trio.to_thread.run_sync(run.finish)
    await _evaluate(ctx, evaluator, run, heldout, "after")
    await trio.to_thread.run_sync(run.tracker.close)  # W&B finishes its run: seconds, off the event loop
    ctx.events.emit(Trained(steps=run.state.step, version=run.state.version, final=str(final),
                             gate=dict(gate.counts), heldout=heldout,
                             banned=sorted({str(p) for p in gate.reputation.banned()} | gate.evidence.banned())))


def _step_event(record: StepRecord, batch: list[RolloutGroup], gate: RolloutGate,
                tokenizer: PreTrainedTokenizerBase) -> TrainStep:
    """The train_step event: what the step trained on, so a flat reward can be told from an empty batch."""

    completions = [c for g in batch for c in g.completions]
    rewards = [[round(c.reward, 3) for c in g.completions] for g in batch]
    return TrainStep(
        step=record.step, reward=record.reward if record.groups else None,
        stage=record.stage, version=record.version, groups=len(batch), refused=record.refused,
        trained_groups=record.groups_trained, zero_advantage_groups=sum(
            len(set(r)) < 2 for r in rewards), lags=dict(Counter(gate.newest - g.policy_version for g in batch)),
        group_rewards=[round(sum(r) / len(r), 3) for r in rewards if r],
        mean_tokens=round(sum(len(c.tokens) for c in completions) / max(1, len(completions)), 1),
        hit_length=sum(c.finish_reason == "length" for c in completions), completions=len(completions),
        entropy=round(record.entropy, 3), skipped=record.skipped, loss=record.loss, kl=record.kl, lr=record.lr,
        step_seconds=record.seconds,  # the figures a Prometheus scrape shows (swarm.node.metrics)
        workers=sorted({g.worker for g in batch}), gate=dict(gate.counts),
        sample=_sample_text(batch, tokenizer),
    )


def _sample_text(batch: list[RolloutGroup], tokenizer: PreTrainedTokenizerBase) -> str:
    """What the policy writes: the best-rewarded completion of the batch, decoded as its reward was computed."""

    best = max((c for g in batch for c in g.completions), key=lambda c: c.reward, default=None)
    return "" if best is None else decode_completion(tokenizer, best.tokens)[:80]


def _open_training_run(loaded: LoadedModel, cfg: TrainerConfig, curriculum: Curriculum) -> TrainingRun:
    import torch

    from trainer.loop import TrainingRun
    from trainer.session import seed_everything

    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    seed_everything(cfg.seed)
    return TrainingRun(loaded, cfg, curriculum, trusted_source=False)  # workers' logprobs are claims: recompute


async def _first_version(ctx: TrainerContext, run: TrainingRun, publisher: SwarmPublisher, gate: RolloutGate,
                         evaluator: Evaluator, heldout: dict[str, float]) -> None:
    """Publish the first version once a quorum of validators is heard, scoring the starting policy meanwhile (the
    scoring only reads the weights, and no step runs before it ends)."""
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_evaluate, ctx, evaluator, run, heldout, "before")
        await publisher.wait_for_validators(ctx.settings.trainer.quorum, ctx.settings.trainer.replicas)
        await _number_past_the_swarm(ctx, run, publisher)
        await _publish_newest(run, publisher, gate)


def _open_evaluator(run: TrainingRun, cfg: TrainerConfig, curriculum: Curriculum) -> Evaluator:
    """The local loop's held-out evaluation for the swarm trainer: the split `swarm train` and `swarm eval` set
    aside (the run spec's training prompts never include it), greedy, `eval_n` prompts, written to eval.jsonl."""
    from trainer.evaluate import constant_answer_accuracy
    from trainer.session import Evaluator, load_task_split

    train_set, heldout = load_task_split(cfg)
    evaluator = Evaluator(run.loaded, heldout, cfg, curriculum, on_result=run.tracker.evaluation)
    evaluator.constant_answer = constant_answer_accuracy(train_set, heldout, n=cfg.eval_n, seed=cfg.seed)
    return evaluator


async def _evaluate(ctx: TrainerContext, evaluator: Evaluator, run: TrainingRun, heldout: dict[str, float],
                    when: str) -> None:
    """Score the trainer's live policy on held-out prompts (before training, every `eval_every` steps, after).

    Why in the swarm trainer too: a step's reward is measured on the few groups it trains on, so only held-out
    accuracy tells a run's owner whether the swarm is teaching the policy anything. It runs in a worker thread, so
    the peer keeps serving and gossiping; no training step runs meanwhile (it is awaited between steps)."""
    record = await trio.to_thread.run_sync(evaluator, run.state.step)
    heldout[when] = record["accuracy"]
    heldout["constant_answer"] = evaluator.constant_answer[1]
    ctx.events.emit(Evaluated(when=when, step=record["step"], accuracy=record["accuracy"], n=record["n"], message=(
        f"held-out accuracy {when} training (step {record['step']}): {record['accuracy']:.3f} "
        f"on {record['n']} prompts never trained on")))


async def _start_training_run(ctx: TrainerContext, cfg: TrainerConfig, curriculum: Curriculum) -> TrainingRun:
    """Load the base model onto the peer's device and open the training run (resuming it from its checkpoint)."""
    from inference.select import resolve_device
    from swarm.policy.files import load_base_model

    loaded = await load_base_model(cfg.model)
    device = resolve_device(ctx.peer.device)
    await trio.to_thread.run_sync(loaded.model.to, device)  # it only trains: no CPU generator shares it here
    ctx.events.emit(TrainerDevice(device=str(device), message=f"training on {device}"))
    run = await trio.to_thread.run_sync(_open_training_run, loaded, cfg, curriculum)
    if run.state.step > 0:
        await _resumed(ctx, run)
    return run


async def _resumed(ctx: TrainerContext, run: TrainingRun) -> None:
    """A trainer resumed from its checkpoint: its workers answered the newest version already, to the process that
    stopped, so the same weights go out under a new version number."""
    resumed_at = run.state.version
    await trio.to_thread.run_sync(functools.partial(run.publish_early, even_untrained=True))
    ctx.events.emit(Resumed(step=run.state.step, version=run.state.version, message=(
        f"resumed at step {run.state.step}; the rollouts of v{resumed_at} went with the previous process, so its "
        f"weights go out again as v{run.state.version}")))


async def _publish_when_stuck(ctx: TrainerContext, run: TrainingRun, publisher: SwarmPublisher, gate: RolloutGate,
                              waiting: BatchWait, counts: GateCounts) -> None:
    """Publish a new version now when the newest one cannot bring the next batch
    (swarm.roles.batch_wait.why_publish_now).
    The same weights sent again cost the swarm a manifest: their files have the same roots, which every peer already
    holds."""
    why = why_publish_now(counts, swarm_facts(ctx, run, publisher, gate), waiting, trio.current_time())
    if why is None:
        return
    if (held := newest_in_swarm(ctx)) > gate.newest:
        run.number_past(held)  # workers answer the newest version they hold: one below it would go unanswered
    await trio.to_thread.run_sync(functools.partial(run.publish_early, even_untrained=True))
    ctx.events.emit(PublishingEarly(version=run.state.version, message=(
        f"v{gate.newest} cannot bring the next batch: {why}; so the weights of step {run.state.step} go out as "
        f"v{run.state.version}")))
    await _publish_newest(run, publisher, gate)
    waiting.restart(trio.current_time())


async def _number_past_the_swarm(ctx: TrainerContext, run: TrainingRun, publisher: SwarmPublisher) -> None:
    """Before the first version goes out: when peers hold a version at least as new as the one about to be
    published (an earlier process of this run published it, and its data directory or checkpoint is gone), the
    weights go out past it. Why: workers answer the newest version they hold, so a trainer that published below
    it would wait for rollouts nobody sends."""
    held = newest_in_swarm(ctx)
    if held < run.state.version or run.state.version in publisher.published:
        return
    run.number_past(held)
    await trio.to_thread.run_sync(functools.partial(run.publish_early, even_untrained=True))
    ctx.events.emit(NumberedPast(held=held, version=run.state.version, message=(
        f"peers hold v{held} from an earlier process of this run; its weights go out as v{run.state.version}")))


async def _publish_newest(run: TrainingRun, publisher: SwarmPublisher, gate: RolloutGate) -> None:
    from trainer.checkpoint import policy_dir

    version = run.state.version
    if version in publisher.published:
        return
    await publisher.wait_for_quorum(publisher.ctx.settings.trainer.quorum)

    def register(spec: RunSpec) -> None:
        gate.specs[version] = spec
        gate.newest = version

    await publisher.publish(version, policy_dir(run.policies, version), before_announce=register)


def gate_counts(gate: RolloutGate, workers: set[str]) -> GateCounts:
    """The gate's state as the batch wait's plain values, after expiring what fell out of the async window."""
    ready = gate.expire()
    spec = gate.specs.get(gate.newest)
    return GateCounts(ready=ready, awaiting_votes=len(gate.pending), async_level=gate.async_level, newest=gate.newest,
                      prompts_per_worker=spec.prompts_per_worker if spec is not None else 0,
                      answered_in_full=gate.answered_in_full(gate.newest, workers), tally=dict(gate.counts))


def swarm_facts(ctx: TrainerContext, run: TrainingRun, publisher: SwarmPublisher, gate: RolloutGate) -> SwarmFacts:
    """What the trainer hears of its peers now, as the batch wait's plain values."""
    spec = gate.specs.get(gate.newest)
    return SwarmFacts(
        quorum_here=len(publisher.known_validators()) >= ctx.settings.trainer.quorum,
        workers_known=publisher.workers_known(),
        validators_departed=publisher.validators_departed(spec) if spec is not None else 0,
        validators_changed=publisher.validators_changed(spec) if spec is not None else False,
        newest_held=newest_in_swarm(ctx), trained_since_publish=run.trained_since_publish)


def newest_in_swarm(ctx: TrainerContext) -> int:
    """The newest version among the manifests this peer adopted (only the run key's are adopted), or -1."""
    return max((p.manifest.version for p in ctx.mirror.policies.values()), default=-1)
