"""The statistics of `swarm bench curriculum`: when a run reaches a reward target, and 95 % intervals over seeds.

Why a bootstrap and not a t interval: the per-seed figures (steps to a target, held-out accuracy on 64 prompts) are
bounded and often skewed, a handful of seeds says little about their shape, and a seeded percentile bootstrap needs
no distribution table. Runs that never reach the target are counted apart and enter the step and token figures at
what they spent (a lower bound: the run was still short of the target when its budget ended).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

RESAMPLES = 4000


@dataclass(frozen=True)
class Interval:
    """A mean over seeds with its 95 % percentile-bootstrap interval."""

    mean: float
    low: float
    high: float
    n: int

    def to_dict(self) -> dict:
        return {"mean": round(self.mean, 4), "ci95": [round(self.low, 4), round(self.high, 4)], "n": self.n}


def bootstrap_mean(values: Sequence[float], *, seed: int = 0, resamples: int = RESAMPLES) -> Interval:
    """The mean of `values` and the 2.5th and 97.5th percentiles of the means of `resamples` seeded resamples."""
    if not values:
        raise ValueError("no values to average")
    n = len(values)
    mean = sum(values) / n
    rng = random.Random(seed)
    means = sorted(sum(rng.choice(values) for _ in range(n)) / n for _ in range(resamples))
    return Interval(mean, means[int(0.025 * (resamples - 1))], means[int(0.975 * (resamples - 1))], n)


@dataclass(frozen=True)
class Reach:
    """How far a run went to reach a target: `reached` False means steps and tokens are all it spent."""

    reached: bool
    steps: int
    tokens: int


def reach(rewards: Sequence[float], tokens: Sequence[int], target: float, window: int) -> Reach:
    """The first step count at which the mean reward of the last `window` steps is at least `target`, and the
    generated tokens spent up to and including that step.

    Why a window: one step's reward is measured on a few groups and jumps by tenths from step to step; a single
    lucky batch is not the policy having learned.
    """
    if len(rewards) != len(tokens):
        raise ValueError("one token count per step is needed")
    if window < 1:
        raise ValueError("the window must be at least one step")
    spent = 0
    for i, (reward, used) in enumerate(zip(rewards, tokens)):
        spent += used
        recent = rewards[max(0, i + 1 - window):i + 1]
        if i + 1 >= window and sum(recent) / len(recent) >= target:
            return Reach(True, i + 1, spent)
    return Reach(False, len(rewards), spent)


def summarize_arm(runs: Sequence[dict], *, target: float, window: int) -> dict:
    """Per-arm figures over its seeds: steps and tokens to the target, final held-out accuracy and reward."""
    reaches = [reach(r["rewards"], r["tokens"], target, window) for r in runs]
    return {
        "seeds": len(runs),
        "reached_target": sum(r.reached for r in reaches),
        "steps_to_target": bootstrap_mean([r.steps for r in reaches]).to_dict(),
        "tokens_to_target": bootstrap_mean([r.tokens for r in reaches]).to_dict(),
        "heldout_accuracy": bootstrap_mean([r["heldout_after"] for r in runs]).to_dict(),
        "final_reward": bootstrap_mean([r["final_reward"] for r in runs]).to_dict(),
        "steps": bootstrap_mean([len(r["rewards"]) for r in runs]).to_dict(),
        "tokens": bootstrap_mean([sum(r["tokens"]) for r in runs]).to_dict(),
    }


def paired_difference(first: Sequence[dict], second: Sequence[dict], key: str) -> dict:
    """Mean of first[i][key] - second[i][key] over seeds run by both arms, with its interval (same seed, same
    sampling noise source: the pairing removes the seed-to-seed spread both arms share)."""
    by_seed = {r["seed"]: r[key] for r in second}
    diffs = [r[key] - by_seed[r["seed"]] for r in first if r["seed"] in by_seed]
    return bootstrap_mean(diffs).to_dict()
