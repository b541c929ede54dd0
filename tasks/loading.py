"""One entry point for every task source: a reasoning-gym name or a path to a JSONL/parquet file."""

from __future__ import annotations

from collections.abc import Mapping

from tasks.builtin import load_builtin
from tasks.errors import TaskError
from tasks.taskset import TaskSet
from tasks.userdata import load_user_file


def is_task_file(name: str) -> bool:
    return name.endswith((".jsonl", ".parquet"))


def load_tasks(name: str, *, size: int | None = None, seed: int = 0, config: Mapping | None = None,
               reward_fn: str = "math") -> TaskSet:
    """Load a task set.

    name: a reasoning-gym dataset ("basic_arithmetic", "chain_sum", "countdown", ...) or a .jsonl/.parquet path.
    size, seed, config: for built-in tasks, how many prompts, the generator seed and difficulty overrides
    (e.g. {"max_terms": 4}); a file's size is its row count (a given size keeps its first `size` rows).
    reward_fn: the scorer for user files that do not name one per row.
    """
    if is_task_file(name):
        taskset = load_user_file(name, reward_fn=reward_fn)
        if size is not None and size < len(taskset):
            taskset = taskset.subset(list(range(size)), f"first{size}")
        return taskset
    if size is None:
        raise TaskError(f"built-in task {name!r} needs a size")
    return load_builtin(name, size=size, seed=seed, config=config)
