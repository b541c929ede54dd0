"""The trainer: accepted rollout groups in, GRPO steps, a published policy every k steps, checkpoints out.

Why a `TrainingRun` plus two small runners: the run (model, optimizer, versions, checkpoints, log) is the same
whether rollouts come from a local generator or from the swarm's quorum-accepted stream, so it only exposes
`step(groups)`; the runners decide *when* groups arrive. `run_sync` is async level 0 (generate with the newest
policy, then train); `run_async_process` overlaps training with a generator in its own OS process (the default,
trainer.generator_process), `run_async` with one in a worker thread of this process (a trio task, a bounded memory
channel between them); either way the rollouts' policy is at most `async_level` versions old (INTELLECT-2).
"""

from __future__ import annotations

import json
import shutil
import time
from collections import ChainMap
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Protocol

import torch.distributed as dist
import trio
from safetensors.torch import load_file

from trainer.admission import GenerationContract, Window, refusal
from trainer.checkpoint import POLICY_PREFIX, TrainerState, WholeWeights, policy_dir, prune_checkpoints, publish_policy
from trainer.checkpoint_resume import RUN_KEY, resume, run_identity
from trainer.config import TrainerConfig
from trainer.curriculum import Curriculum
from trainer.distributed import shard
from trainer.errors import GeneratorDied, TrainerError
from trainer.fsdp import ShardedWeights, is_sharded
from trainer.fsdp_step import FsdpPolicyTrainer
from trainer.step import PolicyTrainer, TrainGroup
from trainer.step_record import StepRecord, StepReport
from trainer.tracking import open_tracker
from verify.rollout import RolloutGroup


@dataclass(frozen=True)
class PublishedPolicy:
    """A policy version as workers see it: where its files are and what to generate with it."""

    version: int
    path: Path
    generation: dict  # group_size, temperature, max_new_tokens, stage, stage_index, data


class RolloutSource(Protocol):
    """Produces the rollout groups of one batch with a given policy (blocking; runs in a worker thread)."""

    def generate(self, step: int, policy: PublishedPolicy) -> list[RolloutGroup]: ...


def to_train_group(group: RolloutGroup, contract: GenerationContract, *, with_logprobs: bool = False) -> TrainGroup:
    """What the loss needs of a group, with the temperature and generation limit of its version's `contract` (never
    the group's own claims); the generator's logprobs only when its source is trusted (with_logprobs)."""
    return TrainGroup(
        rollout_id=group.rollout_id().hex(), policy_version=group.policy_version,
        prompt_tokens=group.prompt_tokens, completions=tuple(c.tokens for c in group.completions),
        rewards=tuple(c.reward for c in group.completions), temperature=contract.temperature,
        max_new_tokens=contract.max_new_tokens,
        logprobs=tuple(c.logprobs for c in group.completions) if with_logprobs else (),
    )


class TrainingRun:
    """Model + optimizer + versions + checkpoints + log of one training run in `cfg.out`."""

    def __init__(self, loaded, cfg: TrainerConfig, curriculum: Curriculum, *, collective=None,
                 on_report: Callable[[StepRecord], None] | None = None, started: float | None = None,
                 trusted_source: bool = True) -> None:
        self.loaded, self.cfg, self.curriculum = loaded, cfg, curriculum
        # Rollouts from our own generator carry logprobs we may use as old logprobs (cfg.old_logprobs); the
        # swarm's workers are untrusted, so their groups are trained with recomputed ones.
        self.generator_logprobs = trusted_source and cfg.old_logprobs == "generator"
        self.out = Path(cfg.out)
        self.rank = getattr(collective, "rank", 0)
        self.world_size = getattr(collective, "world_size", 1)
        pad = loaded.tokenizer.pad_token_id
        trainer_class, self.weights = _trainer_for(loaded.model)
        self.trainer = trainer_class(loaded.model, cfg, pad_id=pad if pad is not None else loaded.eos_token_ids[0],
                                     collective=collective, load_version=self._load_version)
        self.state = TrainerState()
        self.published: set[int] = set()
        self.contracts: dict[int, GenerationContract] = {}  # version -> the generation settings published with it
        self._published_at_step = 0  # the step count when the newest version was published
        self._highest_written = -1  # the newest version directory found on disk at start, or written since
        self._checkpointed_version = -1  # the version the newest checkpoint names: kept on disk (_prune_policies)
        self._gathered: tuple | None = None  # (step, module, weights): see _publishable
        self.on_report = on_report or (lambda report: None)
        self._started = time.perf_counter() if started is None else started  # wall_s counts from here
        self._resume_or_publish_initial()
        self.tracker = open_tracker(cfg, self.rank)  # TensorBoard / W&B (cfg.report_to); the caller closes it

    def wants_step(self, steps: int) -> bool:
        """Whether the runners should train another step: below `steps` and inside the time budget, if any."""
        if self.state.step >= steps:
            return False
        limit = self.cfg.time_limit_min
        return not (limit and time.perf_counter() - self._started >= 60.0 * limit)

    # --- versions and checkpoints ----------------------------------------------------------------------------
    def _resume_or_publish_initial(self) -> None:
        resumed = resume(self.cfg, lambda path: self.weights.load(path, self.loaded.model, self.trainer.optimizer,
                                                                   self.trainer.scheduler))
        if resumed is not None:
            found, self.state = resumed
            if self.state.stage_index != self.curriculum.stage_at(self.state.step).index:
                raise TrainerError(f"checkpoint {found} was written under a different curriculum; use a new --out")
            self.published = {v for v in range(self.state.version + 1) if policy_dir(self.policies, v).is_dir()}
            self.contracts = {v: self._published_contract(v) for v in self.published}
            if self.state.version not in self.published:
                raise TrainerError(f"checkpoint {found} names policy v{self.state.version} but its files are gone")
            self._published_at_step = self.state.step
            self._highest_written = self._highest_on_disk()
            self._checkpointed_version = self.state.version
        else:
            # No checkpoint: training starts from the base model, but numbered past any version an earlier process
            # wrote here before its first checkpoint (its versions went out to peers: a number names one set of
            # weights for ever, see _next_version).
            self.state.extra["first_version"] = self._rank_0s(self._highest_on_disk()) + 1
            self._publish(self.first_version)
        self.state.extra[RUN_KEY] = run_identity(self.cfg)  # what later checkpoints record (checkpoint_resume)
        if self.cfg.kl_coef > 0:
            self._rank_0s(0)  # its files are rank 0's to write: they are on disk once every rank got here
            self.trainer.reference = self._load_version(self.first_version)  # kept on disk (see _prune_policies)

    def _rank_0s(self, value: int) -> int:
        """Rank 0's `value` on every rank (a collective; `value` itself when training alone).

        Why: what a rank finds on disk depends on when it looks, and rank 0 writes there. A rank that counts the
        versions on disk after rank 0 has published the first one numbers its versions one higher, refuses the next
        batches as stale and trains none of its share.
        """
        if self.world_size == 1:
            return value
        return int(self.trainer.collective.all_max(float(value) if self.rank == 0 else float("-inf")))

    @property
    def first_version(self) -> int:
        """The run's initial policy version: the base model's weights, and the KL reference."""
        return int(self.state.extra.get("first_version", 0))

    def _highest_on_disk(self) -> int:
        return max((_version_of(p) for p in self.policies.glob(f"{POLICY_PREFIX}*")), default=-1)

    def number_past(self, version: int) -> None:
        """Number the next version past `version`: the swarm holds it from an earlier process of this run."""
        self._highest_written = max(self._highest_written, version)

    @property
    def policies(self) -> Path:
        return self.out / "policies"

    def _publish(self, version: int) -> None:
        generation = self.curriculum.generation_settings(self.state.step, self.cfg.temperature)
        module, weights = self._publishable()
        if self.rank == 0:
            publish_policy(policy_dir(self.policies, version), module, self.loaded.tokenizer,
                           self._description(), generation, self.cfg.publish_dtype)
            self._prune_policies(version)
        self.trainer.mark_published(version, snapshot=not self.generator_logprobs, weights=weights)
        self.published.add(version)
        self.contracts[version] = GenerationContract.from_generation(generation)
        self.state.version = version
        self._published_at_step = self.state.step
        self._highest_written = max(self._highest_written, version)

    def _next_version(self) -> int:
        """One past every version this run ever wrote, checkpointed or not.

        Why not the checkpoint's version + 1: after a crash between checkpoints the versions written after the
        last checkpoint are on disk, and in the swarm they were announced; training the same steps again gives
        other weights, and a number must name one set of weights for ever (peers answer each version once).
        """
        return max(self.state.version, self._highest_written) + 1

    @property
    def trained_since_publish(self) -> bool:
        """Whether steps were taken since the newest version was published (its weights are no longer current)."""
        return self.state.step != self._published_at_step

    def publish_early(self, *, even_untrained: bool = False) -> bool:
        """Publish the current weights as the next version before `steps_per_policy` steps have passed; False (and
        nothing published) when no step was taken since the newest version, whose weights these still are, unless
        `even_untrained`.

        Why: in the swarm each worker answers its assigned prompts once per version, so when the workers together
        supply fewer groups per version than `prompts_per_step * steps_per_policy`, a trainer that waited for its
        schedule would wait for ever; a new version is what makes them generate again. `even_untrained` sends the
        same weights out again under a new number: for a swarm trainer resumed from a checkpoint (its workers
        answered the newest version before it stopped, and those rollouts died with it) and for a version whose
        run spec names validators that are not there.
        """
        if not (self.trained_since_publish or even_untrained):
            return False
        self._publish(self._next_version())
        return True

    def _description(self) -> dict:
        desc = dict(self.loaded.description)
        desc.pop("source", None)
        return desc

    def _prune_policies(self, newest: int) -> None:
        """Keep the async window's versions (+1) on disk; they are the importance-sampling fallback. Also kept: the
        KL reference, and the version the newest checkpoint names, which a restart resumes from (a swarm trainer
        publishes early whenever its workers run dry, so versions can outrun checkpoints by more than the window:
        a trainer killed then could not restart, its checkpoint naming a version already deleted)."""
        for v in sorted(self.published):
            kept = (v == self.first_version and self.cfg.kl_coef > 0) or v == self._checkpointed_version
            if v < newest - self.cfg.async_level - 1 and not kept:
                shutil.rmtree(policy_dir(self.policies, v), ignore_errors=True)
                self.published.discard(v)
                self.contracts.pop(v, None)

    def _published_contract(self, version: int) -> GenerationContract:
        """The generation settings a version went out with, read back from its generation.json on resume."""
        try:
            return GenerationContract.from_generation(
                json.loads((policy_dir(self.policies, version) / "generation.json").read_text()))
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise TrainerError(f"policy v{version} has no readable generation.json ({type(exc).__name__}); "
                               f"its rollouts cannot be trained with its own settings") from None

    def _load_version(self, version: int) -> dict | None:
        path = policy_dir(self.policies, version) / "model.safetensors"
        return load_file(str(path)) if path.is_file() else None

    def latest_policy(self) -> PublishedPolicy:
        path = policy_dir(self.policies, self.state.version)
        return PublishedPolicy(self.state.version, path, json.loads((path / "generation.json").read_text()))

    def window(self) -> Window:
        return Window(self.cfg.run, self.state.version, self.cfg.async_level, frozenset(self.published),
                      dict(self.contracts))

    def checkpoint(self) -> Path | None:
        self.state.stage_index = self.curriculum.stage_at(self.state.step).index
        saved = self.weights.save(self.out / "checkpoints", self.loaded.model, self.trainer.optimizer,
                                  self.trainer.scheduler, self.state, write=self.rank == 0)
        if self.rank == 0:
            prune_checkpoints(self.out / "checkpoints", self.cfg.keep_last)
        self._checkpointed_version = self.state.version
        return saved

    # --- one step --------------------------------------------------------------------------------------------
    def step(self, groups: list[RolloutGroup]) -> StepRecord:
        """Admit, train, publish every `steps_per_policy` steps, checkpoint; returns the step's log record."""
        window, accepted, refused = self.window(), [], []
        batch: dict[str, int] = {}
        seen = ChainMap(batch, self.state.consumed)  # slots trained on before, or earlier in this batch
        for group in groups:
            reason = refusal(group, window, seen)
            (refused if reason else accepted).append(reason or group)
            if not reason:
                batch[group.slot().key().hex()] = group.policy_version
        mine = shard(accepted, self.rank, self.world_size)  # data parallel: this rank's share, gradients summed
        report = self.trainer.train_step(self.state.step, [
            to_train_group(g, window.contracts[g.policy_version], with_logprobs=self.generator_logprobs)
            for g in mine])
        self.state.consumed.update(batch)
        floor = window.latest_version - window.async_level  # older slots are refused as too stale: forget them
        self.state.consumed = {rid: v for rid, v in self.state.consumed.items() if v >= floor}
        if self.world_size > 1:
            report = self._whole_batch(report, accepted)
        record = self._record(report, accepted, refused)
        self.state.step += 1
        if self.state.step % self.cfg.steps_per_policy == 0:
            self._publish(self._next_version())
        if self.state.step % self.cfg.checkpoint_every == 0:
            self.checkpoint()
        record = replace(record, version=self.state.version)
        self._log(record)
        return record

    def _whole_batch(self, report: StepReport, accepted) -> StepReport:
        """Data parallel: turn this rank's share of the step's figures into the whole batch's (a collective, so
        every rank calls it at every step). The summed loss is the batch loss: each share is already divided by
        the global normaliser."""
        rewards = [c.reward for g in accepted for c in g.completions]
        collective = self.trainer.collective
        tokens = collective.all_sum(float(report.tokens))
        means = {name: collective.all_sum(getattr(report, name) * report.tokens) / max(tokens, 1.0)
                 for name in ("entropy", "kl", "clip_fraction")}  # token-weighted means
        return replace(report, **means, reward=sum(rewards) / len(rewards) if rewards else 0.0, groups=len(accepted),
                       groups_trained=int(collective.all_sum(float(report.groups_trained))),
                       loss=collective.all_sum(float(report.loss)), tokens=int(tokens))

    def _record(self, report: StepReport, accepted, refused: list[str]) -> StepRecord:
        stage = self.curriculum.stage_at(self.state.step)
        generated = sum(len(c.tokens) for g in accepted for c in g.completions)
        self.state.extra["tokens"] = self.state.extra.get("tokens", 0) + generated
        elapsed = time.perf_counter() - self._started
        lags = [self.state.version - g.policy_version for g in accepted]
        return StepRecord(**asdict(report), stage=stage.stage.name, stage_index=stage.index,
                          refused=len(refused), refusals=sorted(set(refused))[:3], max_lag=max(lags, default=0),
                          generated_tokens=generated, wall_s=round(elapsed, 3),
                          tokens_per_s=round(self.state.extra["tokens"] / max(elapsed, 1e-9), 1))

    def _log(self, record: StepRecord) -> None:
        if self.rank == 0:
            self.out.mkdir(parents=True, exist_ok=True)
            with open(self.out / "log.jsonl", "a") as handle:
                handle.write(json.dumps(record.to_json()) + "\n")
        self.tracker.step(record)
        self.on_report(record)

    def finish(self) -> Path:
        """Checkpoint and write the final policy to out/final (loadable with `--model out/final`)."""
        self.checkpoint()
        final = self.out / "final"
        module, _ = self._publishable()
        if self.rank == 0:
            generation = self.curriculum.generation_settings(self.state.step, self.cfg.temperature)
            publish_policy(final, module, self.loaded.tokenizer, self._description(), generation)
        return final

    def evaluable(self):
        """The loaded model with weights an evaluation may run alone on rank 0: the live model, or under FSDP a
        gathered plain copy (a collective: every rank calls this at the same points)."""
        module, _ = self._publishable()
        return self.loaded if module is self.loaded.model else replace(self.loaded, model=module)

    def _publishable(self) -> tuple:
        """(module, weights) of `self.weights.publishable` for the weights of this step, made once per step: a
        version published at a step, the final policy and the evaluations at that step share one copy (under FSDP
        each is a gather of the whole model on every rank). The weights change only inside `step`, which also
        advances the step count, so the step number says whether the copy is current."""
        if self._gathered is None or self._gathered[0] != self.state.step:
            self._gathered = (self.state.step, *self.weights.publishable(self.loaded.model))
        return self._gathered[1:]


def _trainer_for(model) -> tuple[type, object]:
    """(PolicyTrainer class, weights I/O) for a whole model or one sharded by trainer.fsdp.apply_fsdp."""
    if dist.is_available() and dist.is_initialized() and is_sharded(model):  # only in a group can it be sharded
        return FsdpPolicyTrainer, ShardedWeights()
    return PolicyTrainer, WholeWeights()


def run_sync(run: TrainingRun, source: RolloutSource, steps: int, between: Callable[[], None] | None = None) -> None:
    """Async level 0: each batch is generated by the newest published policy, then trained on."""
    while run.wants_step(steps):
        run.step(source.generate(run.state.step, run.latest_policy()))
        if between:
            between()


async def run_async(run: TrainingRun, source: RolloutSource, steps: int,
                    between: Callable[[], None] | None = None) -> None:
    """A generator task runs concurrently with training; groups cross a bounded channel of one batch.

    Why the bound: with at most one batch waiting plus one being generated, a group is at most ~2 versions old
    when steps_per_policy is 1; the admission window refuses anything older than async_level anyway.
    """
    send, recv = trio.open_memory_channel(run.cfg.prompts_per_step)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_generate_forever, run, source, send)
        async with recv:
            while run.wants_step(steps):
                batch = [await recv.receive() for _ in range(run.cfg.prompts_per_step)]
                await trio.to_thread.run_sync(run.step, batch)
                if between:
                    await trio.to_thread.run_sync(between)
        nursery.cancel_scope.cancel()


async def _generate_forever(run: TrainingRun, source: RolloutSource, send) -> None:
    """Generate batch after batch with the newest policy; wait (backpressure) when the channel is full."""
    gen_step = run.state.step
    async with send:
        while True:
            policy = run.latest_policy()
            groups = await trio.to_thread.run_sync(source.generate, gen_step, policy)
            for group in groups:
                await send.send(group)
            gen_step += 1


async def run_async_process(run: TrainingRun, generator, steps: int,
                            between: Callable[[], None] | None = None) -> None:
    """Train while a GeneratorProcess generates the next batches; each newly published version is sent to it.

    Why `async_level` batches requested ahead: the request for step s + L goes out when batch s arrives, when the
    trainer holds the version trained through step s - 1, so that batch is at most L versions old when trained on
    (fewer when steps_per_policy > 1); with L >= 1 the generator already has its next request when it finishes a
    batch, so it never waits on the trainer. L is cfg.generator_prefetch, else async_level. The admission window
    still refuses anything older.
    """
    prime_generator(run, generator, steps)
    while run.wants_step(steps):
        step, groups = await _next_batch(generator, run.cfg.generator_timeout_s)
        keep_requesting(run, generator, step, steps)
        run.step(groups)
        generator.publish(run.latest_policy())
        if between:
            between()


def keep_requesting(run: TrainingRun, generator, step: int, steps: int) -> None:
    """On the batch of `step`: check it is the step the trainer is at, and request the one `ahead` steps on."""
    if step != run.state.step:
        raise TrainerError(f"the generator sent the batch of step {step} while the trainer is at step "
                           f"{run.state.step}")
    following = step + _requests_ahead(run.cfg)
    if following < steps:
        generator.request(following)


def _requests_ahead(cfg) -> int:
    return cfg.generator_prefetch or max(1, cfg.async_level)


def prime_generator(run: TrainingRun, generator, steps: int) -> None:
    """Send the newest version and request the first batches (run_async_process does it too; both are idempotent,
    so a session primes the generator before its first evaluation and the first batches are ready after it)."""
    generator.publish(run.latest_policy())
    for step in range(run.state.step, min(steps, run.state.step + _requests_ahead(run.cfg))):
        generator.request(step)


async def _next_batch(generator, timeout_s: float):
    """Poll in a worker thread (the event loop stays responsive); a silent generator is an error after timeout_s."""
    with trio.move_on_after(timeout_s):
        while True:
            batch = await trio.to_thread.run_sync(generator.poll)
            if batch is not None:
                return batch
    raise GeneratorDied(f"the generator process sent no batch within {timeout_s:.0f} s")


def _version_of(path: Path) -> int:
    """The version a policy directory's name gives (`policy_dir`), or -1 for anything else found there."""
    digits = path.name[len(POLICY_PREFIX):]
    return int(digits) if path.is_dir() and digits.isdigit() else -1
