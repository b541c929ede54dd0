"""Built-in offline tasks from reasoning-gym (procedural generators with verifiable scorers).

Why reasoning-gym: it generates unlimited, seeded problems offline, each with its own scorer, and exposes its
difficulty knobs as config fields, so the same (name, size, seed, config) rebuilds the same prompts on any peer.
"""

from __future__ import annotations

from collections.abc import Mapping

from tasks.errors import TaskError
from tasks.taskset import TaskEntry, TaskSet

# Difficulty presets that keep prompts short enough for small models; any field can be overridden by the caller.
DEFAULT_CONFIGS: dict[str, dict] = {
    "basic_arithmetic": {"min_terms": 2, "max_terms": 3, "min_digits": 1, "max_digits": 2},
    "chain_sum": {"min_terms": 2, "max_terms": 3, "min_digits": 1, "max_digits": 2},
    "countdown": {"min_numbers": 3, "max_numbers": 4, "min_target": 10, "max_target": 100},
}


def builtin_names() -> list[str]:
    """Every reasoning-gym dataset name this installation knows."""
    from reasoning_gym.factory import DATASETS

    return sorted(DATASETS)


# `scorer` in a task config picks the reward function instead of the dataset's own. Why: reasoning-gym's default
# scorer gives partial credit when the reference answer is a substring of the given one ("600" for 60 earns 2/3,
# "-60" too), which a policy learns to exploit; "numeric" pays only for the exact number.
SCORERS = ("rg", "numeric", "exact", "math")


def load_builtin(name: str, *, size: int, seed: int, config: Mapping | None = None) -> TaskSet:
    """Generate `size` prompts of reasoning-gym task `name` with `seed`; `config` overrides difficulty fields
    and may name a `scorer` (one of SCORERS; default "rg", the dataset's own)."""
    import reasoning_gym

    if name not in builtin_names():
        raise TaskError(f"unknown task {name!r}: not a reasoning-gym dataset and not a .jsonl/.parquet file")
    if size <= 0:
        raise TaskError(f"task set size must be positive, got {size}")
    merged = {**DEFAULT_CONFIGS.get(name, {}), **dict(config or {})}
    scorer = merged.pop("scorer", "rg")
    if scorer not in SCORERS:
        raise TaskError(f"task {name!r}: unknown scorer {scorer!r} (choose one of {', '.join(SCORERS)})")
    try:
        dataset = reasoning_gym.create_dataset(name, size=size, seed=seed, **merged)
    except (TypeError, ValueError, AssertionError) as exc:
        raise TaskError(f"task {name!r} rejects config {merged}: {exc}") from None
    entries = [
        TaskEntry(dataset=name, index=i, prompt=item["question"], answer=str(item["answer"]),
                  metadata=dict(item.get("metadata", {})), reward_fn=f"rg:{name}" if scorer == "rg" else scorer)
        for i, item in enumerate(dataset)
    ]
    spec_config = merged if scorer == "rg" else {**merged, "scorer": scorer}
    return TaskSet(name, entries, {"name": name, "size": size, "seed": seed, "config": spec_config})
