"""One entry point for every task source: a reasoning-gym name, a local task file or a cached hub dataset."""

from __future__ import annotations

import difflib
from collections.abc import Mapping

from tasks.builtin import builtin_names, load_builtin
from tasks.errors import TaskError
from tasks.hub_data import load_hub_dataset, parse_hub_dataset
from tasks.taskset import TaskSet
from tasks.userdata import TASK_FILE_SUFFIXES, load_user_file


def is_task_file(name: str) -> bool:
    """A local task file (.jsonl, .json, .parquet, .csv), not a file of the hub."""
    return name.endswith(TASK_FILE_SUFFIXES) and parse_hub_dataset_quietly(name) is None


def is_builtin_task(name: str) -> bool:
    """A reasoning-gym name: neither a task file nor a hub dataset (only these take a size and a config)."""
    return not is_task_file(name) and parse_hub_dataset_quietly(name) is None


def parse_hub_dataset_quietly(name: str):
    """parse_hub_dataset, with a malformed hf:// address counted as a hub dataset (its loading says what is wrong)."""
    try:
        return parse_hub_dataset(name)
    except TaskError:
        return name


def check_builtin_name(name: str) -> None:
    """Refuse, in one sentence with the nearest names, a task name that no source knows."""
    known = builtin_names()
    if name in known:
        return
    near = difflib.get_close_matches(name, known, n=3)
    hint = f"did you mean {', '.join(near)}? " if near else ""
    raise TaskError(f"unknown task {name!r}: not a reasoning-gym dataset ({hint}`swarm tasks` lists them), a task file "
                    f"({', '.join(TASK_FILE_SUFFIXES)}) nor a hub dataset (ORG/NAME)")


def load_tasks(name: str, *, size: int | None = None, seed: int = 0, config: Mapping | None = None,
               reward_fn: str = "math", prompt_key: str = "prompt", answer_key: str = "answer") -> TaskSet:
    """Load a task set.

    name: a reasoning-gym dataset ("basic_arithmetic", "chain_sum", "countdown", ...), a .jsonl/.json/.parquet/.csv
    path, or a hub dataset in the local Hugging Face cache (`ORG/NAME`, `hf://datasets/ORG/NAME/PATH`).
    size, seed, config: for built-in tasks, how many prompts, the generator seed and difficulty overrides
    (e.g. {"max_terms": 4}); a file's size is its row count (a given size keeps its first `size` rows).
    reward_fn: the scorer for rows that do not name one. prompt_key, answer_key: the columns holding a file's or
    dataset's prompt and reference answer.
    """
    columns = {"reward_fn": reward_fn, "prompt_key": prompt_key, "answer_key": answer_key}
    if is_builtin_task(name):
        check_builtin_name(name)
        if size is None:
            raise TaskError(f"built-in task {name!r} needs a size")
        return load_builtin(name, size=size, seed=seed, config=config)
    dataset = parse_hub_dataset(name)
    taskset = load_hub_dataset(dataset, **columns) if dataset else load_user_file(name, **columns)
    if size is not None and size < len(taskset):
        taskset = taskset.subset(list(range(size)), f"first{size}")
    return taskset
