"""Deterministic assignment of prompts to workers (INTELLECT-2's fixed, seeded data assignment).

Why: a worker must not cherry-pick easy prompts. Which prompts a worker answers at a step is a pure function of
the run, the worker's identity, the step and the set of eligible prompt indices (the current curriculum stage's
data segment), so any validator recomputes it and rejects a rollout for a prompt that was not assigned.
"""

from __future__ import annotations

from collections.abc import Sequence

import blake3


def assignment_seed(run: str, worker: str, step: int) -> int:
    """A 64-bit seed naming this worker's assignment at this step."""
    digest = blake3.blake3(f"assign-v1\x00{run}\x00{worker}\x00{step}".encode()).digest()
    return int.from_bytes(digest[:8], "little")


def assign_tasks(run: str, worker: str, step: int, eligible: Sequence[int], count: int) -> list[int]:
    """The `count` prompt indices (distinct while `count <= len(eligible)`) assigned to `worker` at `step`.

    Each pick hashes (seed, pick number) into the remaining pool, a partial Fisher-Yates shuffle driven by BLAKE3,
    so the result does not depend on any RNG library's version. `eligible` must be in a canonical order (sorted).
    """
    if count < 0:
        raise ValueError("count must be non-negative")
    if not eligible:
        return []
    pool = list(eligible)
    seed = assignment_seed(run, worker, step)
    picks: list[int] = []
    for i in range(count):
        remaining = len(pool) - (i % len(pool))
        if i % len(pool) == 0 and i > 0:
            pool = list(eligible)  # more picks than prompts: start another pass
        draw = int.from_bytes(
            blake3.blake3(seed.to_bytes(8, "little") + i.to_bytes(8, "little")).digest()[:8], "little"
        )
        offset = i % len(pool)
        j = offset + draw % remaining
        pool[offset], pool[j] = pool[j], pool[offset]
        picks.append(pool[offset])
    return picks


def is_assigned(run: str, worker: str, step: int, eligible: Sequence[int], count: int, task_index: int) -> bool:
    """True when `task_index` is among the prompts assigned to `worker` at `step`."""
    return task_index in assign_tasks(run, worker, step, eligible, count)
