"""Experiment tracking: every training step's figures to TensorBoard and/or Weights & Biases, beside log.jsonl.

Why sinks behind one small interface: TRL, verl and prime-rl users read their runs in W&B or TensorBoard, while the
trainer only knows `log(scalars, step)`; which sinks listen is a config choice (`report_to`). Each backend imports
its heavy package (torch's SummaryWriter, wandb) in its constructor, so a run that reports nowhere never pays for
it. Files go under the run's output directory: tensorboard/ holds the event files, wandb/ the W&B run and the id
that a restarted trainer resumes. W&B runs offline (no network; `wandb sync` uploads the run later) unless the
config's wandb_mode or the environment's WANDB_MODE says "online".

The x axis is the number of optimizer steps done: a step's figures are logged at step + 1, an evaluation at the
step count it ran after (0 = before training), so the held-out curve lines up with the reward curve.
"""

from __future__ import annotations

import os
import secrets
import time
from dataclasses import asdict, is_dataclass
from pathlib import Path
from typing import Protocol

from trainer.errors import TrainerError
from trainer.step_record import StepRecord

REPORT_TARGETS = ("tensorboard", "wandb")
"""The sinks `report_to` may name (with "none", which names no sink)."""

STEP_SCALARS = {
    "train/reward": "reward", "train/loss": "loss", "train/kl": "kl", "train/entropy": "entropy",
    "train/clip_fraction": "clip_fraction", "train/grad_norm": "grad_norm", "train/lr": "lr",
    "train/groups_accepted": "groups", "train/groups_trained": "groups_trained", "train/groups_refused": "refused",
    "train/curriculum_stage": "stage_index", "train/max_lag": "max_lag", "perf/tokens_per_s": "tokens_per_s",
    "perf/generated_tokens": "generated_tokens", "perf/step_seconds": "seconds", "perf/wall_s": "wall_s",
}
"""Tag -> field of a training log record (trainer.loop.TrainingRun._record): what each sink plots per step."""


class Sink(Protocol):
    """Where scalars go; `close` flushes and releases files."""

    def log(self, scalars: dict[str, float], step: int) -> None: ...

    def close(self) -> None: ...


def parse_report_to(value: str | tuple[str, ...] | list[str]) -> tuple[str, ...]:
    """The sinks named by `value` (comma-separated text or a list of names), each once, in order; "none" names none.
    An unknown name is one sentence naming it."""
    items = value.split(",") if isinstance(value, str) else [part for item in value for part in str(item).split(",")]
    names: list[str] = []
    for item in (item.strip().lower() for item in items):
        if item in ("", "none") or item in names:
            continue
        if item not in REPORT_TARGETS:
            raise TrainerError(f"unknown report_to target {item!r}: choose from tensorboard, wandb or none")
        names.append(item)
    return tuple(names)


class TensorBoardSink:
    """Event files under `out`/tensorboard, flushed at every step so a live `tensorboard --logdir` sees each one.

    Why tensorboard's own event writer and scalar protos (what torch's SummaryWriter wraps): no torch import, and
    one event per step holding every scalar of it."""

    def __init__(self, out: Path) -> None:
        from tensorboard.summary.writer.event_file_writer import EventFileWriter

        self.writer = EventFileWriter(str(Path(out) / "tensorboard"))

    def log(self, scalars: dict[str, float], step: int) -> None:
        from tensorboard.compat.proto.event_pb2 import Event
        from tensorboard.compat.proto.summary_pb2 import Summary

        values = [Summary.Value(tag=tag, simple_value=value) for tag, value in scalars.items()]
        self.writer.add_event(Event(wall_time=time.time(), step=step, summary=Summary(value=values)))
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


RUN_ID_FILE = "run-id"
"""Under `out`/wandb: the W&B run id of this output directory, so a restarted trainer resumes the same run."""


def wandb_run_id(out: Path) -> str:
    """The W&B run id kept in `out`/wandb (written once, atomically, on the first start): every restart of the
    same output directory logs into the same run, its steps continuing the curves."""
    path = Path(out) / "wandb" / RUN_ID_FILE
    try:
        kept = path.read_text().strip()
    except OSError:
        kept = ""
    if kept.isalnum() and len(kept) <= 64:
        return kept
    path.parent.mkdir(parents=True, exist_ok=True)
    fresh = secrets.token_hex(4)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(fresh + "\n")
    os.replace(tmp, path)
    return fresh


class WandbSink:
    """A W&B run whose files live under `out`/wandb, resumed across restarts (wandb_run_id); its project, name,
    tags and mode come from the config, the mode from WANDB_MODE (else offline) when the config names none."""

    def __init__(self, out: Path, name: str, config: dict, options: dict | None = None) -> None:
        import wandb

        options = options or {}
        Path(out).mkdir(parents=True, exist_ok=True)
        mode = options.get("mode") or os.environ.get("WANDB_MODE", "offline")
        project = options.get("project") or os.environ.get("WANDB_PROJECT", "rl-swarm")
        settings = wandb.Settings(silent=True, console="off", x_disable_stats=True, save_code=False)
        self.run = wandb.init(project=project, name=options.get("name") or name, tags=list(options.get("tags", ())),
                              id=wandb_run_id(out), resume="allow", dir=str(out), mode=mode, config=config,
                              settings=settings, reinit="create_new")

    def log(self, scalars: dict[str, float], step: int) -> None:
        self.run.log(dict(scalars), step=step)

    def close(self) -> None:
        self.run.finish()


def open_sink(name: str, out: Path, run_name: str, config: dict) -> Sink:
    if name == "tensorboard":
        return TensorBoardSink(out)
    options = {"project": config.get("wandb_project"), "name": config.get("wandb_name"),
               "tags": config.get("wandb_tags") or (), "mode": config.get("wandb_mode")}
    return WandbSink(out, run_name, config, options)


class RunTracker:
    """The sinks of one training run, fed by the trainer's step records and evaluations."""

    def __init__(self, sinks: list[Sink]) -> None:
        self.sinks = sinks

    def log(self, scalars: dict[str, float], step: int) -> None:
        if scalars:
            for sink in self.sinks:
                sink.log(scalars, step)

    def step(self, record: StepRecord) -> None:
        """One training step's log record, at the step count it completes."""
        self.log(step_scalars(record), record.step + 1)

    def evaluation(self, record: dict) -> None:
        """A held-out evaluation (trainer.session.Evaluator's record), at the step count it ran after."""
        self.log(_numbers({"eval/heldout_accuracy": record.get("accuracy"),
                           "eval/mean_reward": record.get("mean_reward"),
                           "eval/mean_tokens": record.get("mean_tokens")}), int(record["step"]))

    def close(self) -> None:
        sinks, self.sinks = self.sinks, []
        for sink in sinks:
            sink.close()


def open_tracker(cfg, rank: int = 0) -> RunTracker:
    """The tracker `cfg.report_to` asks for; none but rank 0's reports (the other ranks hold the same figures)."""
    names = parse_report_to(cfg.report_to) if rank == 0 else ()
    config = _plain(asdict(cfg) if is_dataclass(cfg) else cfg.model_dump() if hasattr(cfg, "model_dump") else {})
    return RunTracker([open_sink(name, Path(cfg.out), cfg.run, config) for name in names])


def step_scalars(record: StepRecord) -> dict[str, float]:
    """The plotted figures of a training log record; groups filtered for a zero advantage and steps done added."""
    scalars = _numbers({tag: getattr(record, key) for tag, key in STEP_SCALARS.items()})
    if "train/groups_accepted" in scalars and "train/groups_trained" in scalars:
        scalars["train/groups_filtered"] = scalars["train/groups_accepted"] - scalars["train/groups_trained"]
    scalars["perf/steps"] = float(record.step + 1)
    return scalars


def gate_scalars(counts: dict[str, int]) -> dict[str, float]:
    """The swarm trainer's gate (swarm.roles.gate counts): groups accepted and rejected by a quorum, timed out,
    and refused before any vote."""
    refused = sum(n for what, n in counts.items() if what.startswith("refused:"))
    return {"swarm/groups_accepted": float(counts.get("accepted", 0)),
            "swarm/groups_rejected": float(counts.get("rejected", 0)),
            "swarm/groups_timed_out": float(counts.get("timed_out", 0)), "swarm/groups_refused": float(refused)}


def _numbers(values: dict) -> dict[str, float]:
    """The entries that are numbers (bools and missing figures left out); a non-finite one stays (a NaN loss is
    worth seeing on the plot)."""
    return {k: float(v) for k, v in values.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}


def _plain(value):
    """A config as W&B stores it: paths as text."""
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return str(value) if isinstance(value, Path) else value
