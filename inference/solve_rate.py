"""The solve-rate estimator behind offline difficulty filtering (tasks/difficulty.py), over any backend.

Why its own sampling keys: the estimate is not a rollout anyone verifies, but it should still be reproducible,
so each task's samples use the fixed run name "offline-filter" and that task's index.
"""

from __future__ import annotations

from inference.backend import GenerationBackend
from inference.rollouts import make_request
from tasks.difficulty import SolveRateEstimator
from tasks.prompts import decode_completion
from tasks.taskset import TaskEntry
from verify.rewards import compute_reward

FILTER_RUN = "offline-filter"


def solve_rate_estimator(backend: GenerationBackend, tokenizer, *, samples: int, temperature: float,
                         max_new_tokens: int, batch_prompts: int = 8, threshold: float = 1.0) -> SolveRateEstimator:
    """An estimator: per task, the fraction of `samples` completions whose reward reaches `threshold`."""

    def estimate(entries: list[TaskEntry]) -> list[float]:
        rates: list[float] = []
        for start in range(0, len(entries), batch_prompts):
            batch = entries[start:start + batch_prompts]
            requests = [make_request(tokenizer, e, run=FILTER_RUN, worker="base", step=0, group_size=samples,
                                     temperature=temperature, max_new_tokens=max_new_tokens) for e in batch]
            for entry, group in zip(batch, backend.generate(requests)):
                solved = sum(compute_reward(entry.reward_fn, decode_completion(tokenizer, c.tokens), entry.to_dict())
                             >= threshold for c in group.completions)
                rates.append(solved / samples)
        return rates

    return estimate
