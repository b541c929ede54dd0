"""Offline difficulty filtering (INTELLECT-2 section 3.1): keep tasks the base policy solves sometimes, not always.

Why: a prompt that every completion solves (or none does) gives GRPO groups whose advantages are all zero, so it
costs generation and teaches nothing. INTELLECT-2 kept tasks whose base-model solve rate lay in [0.1, 0.8].
Estimating a rate costs n generations per task, so estimates are cached on disk, keyed by model, task set,
sample count and index, and a second run regenerates nothing. The estimator is injected (inference/solve_rate.py
provides one over a generation backend) so tasks/ never imports a model.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import blake3

from tasks.errors import TaskError
from tasks.taskset import TaskEntry, TaskSet

# Given task entries, return each one's estimated solve rate in [0, 1] (same order).
SolveRateEstimator = Callable[[list[TaskEntry]], list[float]]


@dataclass(frozen=True)
class DifficultyBand:
    """Keep a task when low <= solve rate <= high (INTELLECT-2: 0.1 and 0.8)."""

    low: float = 0.1
    high: float = 0.8

    def __post_init__(self) -> None:
        if not 0.0 <= self.low <= self.high <= 1.0:
            raise TaskError(f"difficulty band [{self.low}, {self.high}] must satisfy 0 <= low <= high <= 1")

    def keeps(self, rate: float) -> bool:
        return self.low <= rate <= self.high


def taskset_key(taskset: TaskSet) -> str:
    """A short id of how the set was made (its spec), so two different sets named alike never share estimates."""
    canonical = json.dumps(dict(taskset.spec), sort_keys=True, default=str)
    return f"{taskset.name}:{blake3.blake3(canonical.encode()).hexdigest()[:16]}"


class SolveRateCache:
    """A JSON file of solve-rate estimates: {"version": 1, "rates": {"<model>|<taskset>|n<k>|<index>": rate}}."""

    def __init__(self, path: str | Path | None) -> None:
        self.path = Path(path) if path else None
        self.rates: dict[str, float] = {}
        if self.path and self.path.exists():
            try:
                data = json.loads(self.path.read_text())
                self.rates = {str(k): float(v) for k, v in data["rates"].items()}
            except (OSError, ValueError, KeyError, TypeError, AttributeError):
                raise TaskError(f"solve-rate cache {self.path} is corrupt; delete it to re-estimate") from None

    @staticmethod
    def key(model_id: str, tset: str, samples: int, index: int) -> str:
        return f"{model_id}|{tset}|n{samples}|{index}"

    def save(self) -> None:
        if not self.path:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(self.path.suffix + ".tmp")
        tmp.write_text(json.dumps({"version": 1, "rates": self.rates}, sort_keys=True))
        os.replace(tmp, self.path)


def estimate_solve_rates(taskset: TaskSet, estimate: SolveRateEstimator, *, model_id: str, samples: int,
                         cache_path: str | Path | None = None) -> dict[int, float]:
    """Every task's solve rate, estimating only those the cache lacks, then saving the cache."""
    cache = SolveRateCache(cache_path)
    tkey = taskset_key(taskset)
    missing = [e for e in taskset if cache.key(model_id, tkey, samples, e.index) not in cache.rates]
    if missing:
        rates = estimate(missing)
        if len(rates) != len(missing):
            raise ValueError(f"estimator returned {len(rates)} rates for {len(missing)} tasks")
        for entry, rate in zip(missing, rates):
            cache.rates[cache.key(model_id, tkey, samples, entry.index)] = float(rate)
        cache.save()
    return {e.index: cache.rates[cache.key(model_id, tkey, samples, e.index)] for e in taskset}


def filter_by_solve_rate(taskset: TaskSet, estimate: SolveRateEstimator, *, model_id: str, samples: int,
                         band: DifficultyBand = DifficultyBand(), cache_path: str | Path | None = None) -> TaskSet:
    """The subset of `taskset` whose estimated solve rate lies within `band` (indices preserved)."""
    rates = estimate_solve_rates(taskset, estimate, model_id=model_id, samples=samples, cache_path=cache_path)
    return taskset.subset([i for i, r in rates.items() if band.keeps(r)], f"solve-rate[{band.low},{band.high}]")
