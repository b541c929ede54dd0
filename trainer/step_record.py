"""One training step as the run logs it (log.jsonl, the trackers, the swarm trainer's train_step event)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field


@dataclass(frozen=True)
class StepReport:
    """What one step did; one JSON line of the training log."""

    step: int
    reward: float  # mean reward of every completion in the batch (filtered groups included)
    groups: int
    groups_trained: int  # after online filtering
    tokens: int
    loss: float
    entropy: float
    kl: float
    clip_fraction: float
    grad_norm: float
    lr: float
    skipped: str  # "" when the optimizer stepped, else the reason (e.g. "non-finite loss")
    old_logprobs: str  # which gave the old logprobs: "exact", "current" (fallback), "generator" or a mix
    seconds: float


@dataclass(frozen=True)
class StepRecord(StepReport):
    """The optimizer's report (StepReport, above) with where the run stood: its curriculum stage, what it
    refused, how stale the batch was, its throughput, and the version after the step. Data parallel: the figures
    are the whole batch's (trainer.loop.TrainingRun._whole_batch)."""

    stage: str = ""  # the curriculum stage's name
    stage_index: int = 0  # its index in the schedule
    refused: int = 0  # groups refused (stale, replayed, unknown version)
    refusals: list[str] = field(default_factory=list)  # up to three distinct reasons, sorted
    max_lag: int = 0  # the largest version lag among the accepted groups
    generated_tokens: int = 0  # completion tokens in the accepted groups
    wall_s: float = 0.0  # seconds since the run started
    tokens_per_s: float = 0.0  # generated tokens per second over the whole run
    version: int = 0  # the run's policy version after the step (a publish may have raised it)

    def to_json(self) -> dict:
        """The log.jsonl line's fields, in declaration order (the report's first)."""
        return asdict(self)
