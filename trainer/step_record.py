"""One training step as the run logs it (log.jsonl, the trackers, the swarm trainer's train_step event)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from trainer.step import StepReport


@dataclass(frozen=True)
class StepRecord(StepReport):
    """The optimizer's report (trainer.step.StepReport) with where the run stood: its curriculum stage, what it
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
