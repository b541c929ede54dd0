"""A whole local training session: load, split, evaluate, train (sync or async), evaluate, plot, summarise.

Why a separate module: `swarm train` stays a thin CLI and tests drive exactly the same sequence in-process.
The generator gets its own model instance that follows the published policy files, as a swarm worker would;
evaluation runs on the trainer's live weights between steps (in the trainer's thread, so never concurrently
with a step).
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.distributed as dist
import trio

from inference.models import load_model
from inference.select import resolve_device
from inference.torch_backend import TorchBackend
from trainer.config import TrainerConfig
from trainer.curriculum import Curriculum
from trainer.distributed import end_data_parallel, init_parallel
from trainer.evaluate import constant_answer_accuracy, evaluate
from trainer.fsdp import apply_fsdp
from trainer.generator_process import GeneratorProcess, fork_is_safe
from trainer.launch import broadcast_batch, check_supported, world_size
from trainer.local_source import LocalRolloutSource
from trainer.loop import TrainingRun, keep_requesting, prime_generator, run_async, run_async_process, run_sync
from trainer.report import plot_rewards, progress_line, read_log
from trainer.session_setup import load_task_split, seed_everything
from trainer.step_record import StepRecord
from verify.rewards import start_scorer

logger = logging.getLogger(__name__)


class Evaluator:
    """Held-out accuracy of the trainer's live model, appended to eval.jsonl."""

    def __init__(self, loaded, heldout, cfg: TrainerConfig, curriculum: Curriculum,
                 on_result: Callable[[dict], None] = lambda record: None) -> None:
        self.loaded, self.heldout, self.cfg, self.on_result = loaded, heldout, cfg, on_result
        self.max_new_tokens = max(s.max_new_tokens for s in curriculum.stages)
        self.backend = TorchBackend(loaded, capture_proofs=False, max_batch_rows=64)
        self.results: list[dict] = []
        self.constant_answer: tuple[str, float] = ("", 0.0)  # trainer.evaluate.constant_answer_accuracy, if set

    def __call__(self, step: int, loaded=None) -> dict:
        """Evaluate the live model, or `loaded` (a gathered copy of a sharded one, see TrainingRun.evaluable)."""
        loaded = loaded or self.loaded
        backend = self.backend if loaded.model is self.loaded.model else TorchBackend(
            loaded, capture_proofs=False, max_batch_rows=self.backend.max_batch_rows)  # a copy: a backend of its own
        with torch.no_grad():
            result = evaluate(loaded, self.heldout, n=self.cfg.eval_n, seed=self.cfg.seed,
                              max_new_tokens=self.max_new_tokens, backend=backend)
        record = {"step": step, "accuracy": result.accuracy, "mean_reward": result.mean_reward, "n": result.n,
                  "mean_tokens": result.mean_tokens}
        self.results.append(record)
        with open(Path(self.cfg.out) / "eval.jsonl", "a") as handle:
            handle.write(json.dumps(record) + "\n")
        self.on_result(record)
        return record


def train(cfg: TrainerConfig, curriculum: Curriculum, *, echo: Callable[[str], None] = print) -> dict:
    """Run (or resume) a local training session; returns the summary printed as JSON by `swarm train`.

    In async mode with generator = "process" the generator process is forked once the model and task set are
    loaded (where that is safe; else spawned at once, loading its own) and asked for its first batches before the
    first evaluation, so it generates while the trainer evaluates; every log record's wall_s counts from this
    function's start in both modes.
    """
    session_started = time.perf_counter()
    if world_size() > 1:
        return _train_data_parallel(cfg, curriculum, echo, session_started)
    resolve_device(cfg.device)  # a GPU asked for and missing is one line now, not after the model has loaded
    wants_process = bool(cfg.async_level) and cfg.generator == "process"
    with contextlib.ExitStack() as stack:
        if wants_process and not fork_is_safe():
            spawned = stack.enter_context(GeneratorProcess(cfg, max_batches=cfg.async_level))
            return _train(cfg, curriculum, echo, session_started, lambda loaded, train_set: spawned)

        def fork_generator(loaded, train_set):
            if not wants_process:
                return None
            return stack.enter_context(GeneratorProcess(cfg, max_batches=cfg.async_level,
                                                        preloaded=(loaded, train_set)))

        return _train(cfg, curriculum, echo, session_started, fork_generator)


def _train_data_parallel(cfg: TrainerConfig, curriculum: Curriculum, echo: Callable[[str], None],
                         session_started: float) -> dict:
    """One rank of `swarm train --nproc N` (trainer.launch): rank 0 generates (or owns the generator process)
    and evaluates."""
    check_supported(cfg)
    collective = init_parallel(cfg.parallel)
    lead = collective.rank == 0
    try:
        with contextlib.ExitStack() as stack:
            def spawn_generator(loaded, train_set):
                if not (lead and cfg.async_level):
                    return None
                return stack.enter_context(GeneratorProcess(cfg, max_batches=cfg.async_level))

            return _train(cfg, curriculum, echo if lead else (lambda line: None), session_started, spawn_generator,
                          collective=collective)
    finally:
        end_data_parallel()


def _train(cfg: TrainerConfig, curriculum: Curriculum, echo: Callable[[str], None], session_started: float,
           start_generator: Callable, collective=None) -> dict:
    logger.debug("trainer config: %s", cfg.model_dump_json())
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    seed_everything(cfg.seed)
    Path(cfg.out).mkdir(parents=True, exist_ok=True)
    train_set, heldout = load_task_split(cfg)
    lead = collective is None or collective.rank == 0  # generates, evaluates, logs, publishes
    if lead:
        start_scorer({entry.reward_fn for entry in heldout})  # the first evaluation scores; start it during the load
    trainer_model = load_model(cfg.model)
    if collective is not None:
        _broadcast_weights(trainer_model.model)
        if cfg.parallel == "fsdp":
            apply_fsdp(trainer_model.model)  # before TrainingRun builds the optimizer over the shards
    generator = start_generator(trainer_model, train_set)  # None when synchronous or with a generator thread
    if collective is None:  # after the fork: a generator process keeps its CPU copy, and CUDA must not precede fork
        device = resolve_device(cfg.device)
        if device.type != "cpu":
            trainer_model.model.to(device)
            echo(f"training on {device}")
    run = TrainingRun(trainer_model, cfg, curriculum, collective=collective, started=session_started,
                      on_report=lambda record: _report_step(record, cfg.steps, echo))
    if generator is not None:
        prime_generator(run, generator, cfg.steps)  # its first batches are generated during the evaluation
    evaluator = Evaluator(trainer_model, heldout, cfg, curriculum, on_result=run.tracker.evaluation) if lead else None
    started = time.perf_counter()
    weights = run.evaluable()  # every rank: under FSDP gathering the weights is a collective
    if lead:
        before = evaluator(run.state.step, weights)
        constant = constant_answer_accuracy(train_set, heldout, n=cfg.eval_n, seed=cfg.seed)
        echo(f"held-out accuracy before: {before['accuracy']:.3f} on {before['n']} prompts (always answering "
             f"{constant[0]!r}, the most frequent training answer: {constant[1]:.3f})")

    def between() -> None:
        if cfg.eval_every and run.state.step % cfg.eval_every == 0 and run.state.step < cfg.steps:
            weights = run.evaluable()
            if lead:
                accuracy = evaluator(run.state.step, weights)["accuracy"]
                echo(f"held-out accuracy at step {run.state.step}: {accuracy:.3f}")

    if collective is not None:
        _run_data_parallel(cfg, run, train_set, collective, generator, between)
    else:
        _run_loop(cfg, run, train_set, generator, between)
    train_seconds = time.perf_counter() - started
    final = run.finish()
    weights = run.evaluable()
    if not lead:
        return {"rank": collective.rank, "steps": run.state.step, "versions": run.state.version}
    after = evaluator(run.state.step, weights)
    run.tracker.close()
    echo(f"held-out accuracy after: {after['accuracy']:.3f} on {after['n']} prompts; final policy in {final}")
    log = read_log(Path(cfg.out) / "log.jsonl")
    plot = plot_rewards(log, evaluator.results, Path(cfg.out) / "reward.png",
                        f"{cfg.model} on {cfg.task} (async {cfg.async_level}, {curriculum.name})")
    tail = log[-max(1, len(log) // 10):]
    stopped = "steps" if run.state.step >= cfg.steps else "time limit"
    return {"steps": run.state.step, "stopped_by": stopped, "versions": run.state.version,
            "train_seconds": round(train_seconds, 1),
            "first_reward": log[0]["reward"] if log else None,
            "final_reward": sum(r["reward"] for r in tail) / len(tail) if tail else None,
            "heldout_before": before["accuracy"], "heldout_after": after["accuracy"],
            "heldout_constant_answer": constant[1], "final": str(final),
            "log": str(Path(cfg.out) / "log.jsonl"), "plot": str(plot) if plot else None}


def _report_step(record: StepRecord, steps: int, echo: Callable[[str], None]) -> None:
    """The step's progress line; with `-v` every figure of its log record too (log.jsonl's line)."""
    echo(progress_line(record, steps))
    logger.info("step %s: %s", record.step, json.dumps(record.to_json(), default=str))


def _broadcast_weights(model) -> None:
    """Every rank starts from rank 0's weights (a model built from a config with random init could differ). The
    model is still on the CPU here; under nccl each tensor travels through this rank's GPU."""
    device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else None
    for tensor in model.state_dict().values():
        if device is None:
            dist.broadcast(tensor, src=0)
            continue
        staged = tensor.to(device)
        dist.broadcast(staged, src=0)
        tensor.copy_(staged)


def _run_data_parallel(cfg: TrainerConfig, run, train_set, collective, generator,
                       between: Callable[[], None]) -> None:
    """Rank 0 takes each batch (from its generator process when async, else generating it here) and broadcasts it
    (None: stop, so the step count and the time budget are rank 0's decision alone); every rank then takes the same
    step on its share (TrainingRun.step shards)."""
    lead = collective.rank == 0
    source = LocalRolloutSource.for_config(cfg, train_set) if lead and generator is None else None
    while True:
        batch = None
        if lead and run.wants_step(cfg.steps):
            if generator is not None:
                step, batch = generator.receive()
                keep_requesting(run, generator, step, cfg.steps)
            else:
                batch = source.generate(run.state.step, run.latest_policy())
        batch = broadcast_batch(collective, batch)
        if batch is None:
            return
        run.step(batch)
        if generator is not None:
            generator.publish(run.latest_policy())
        between()


def _run_loop(cfg: TrainerConfig, run, train_set, generator, between: Callable[[], None]) -> None:
    """Sync (in-process generator), async with the generator process, or async with a generator thread."""
    if generator is not None:
        trio.run(run_async_process, run, generator, cfg.steps, between)
        return
    source = LocalRolloutSource.for_config(cfg, train_set)
    if cfg.async_level == 0:
        run_sync(run, source, cfg.steps, between)
    else:
        trio.run(run_async, run, source, cfg.steps, between)
