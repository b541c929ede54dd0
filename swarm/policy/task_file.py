"""A run's task file travels with every policy version, so the peers of a run never have to be handed it.

Why: on a user dataset (JSONL or parquet) every inference peer and validator must read exactly the trainer's rows:
indices are what assignment, rollouts and votes agree on, and a volunteer with another copy (an older export, one
edited row) would see its honest work rejected and itself banned. So the trainer snapshots the file once, every
version's manifest lists it beside the weights (the same bytes have the same root, so a peer fetches it once and
holds it across versions), and the run spec names it by that root; peers read it from the version's directory,
reassembled from pieces verified against the signed manifest (swarm.policy.runspec.spec_tasks).
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from p2p.pieces.manifest import file_entry, is_safe_file_name
from swarm.errors import UserError
from tasks.loading import is_builtin_task, is_task_file, load_tasks

if TYPE_CHECKING:
    from tasks.taskset import TaskSet


@dataclass(frozen=True)
class RunTaskFile:
    """The trainer's snapshot of the run's task file."""

    name: str  # its name in every version's directory (the original's, so the task set keeps its name)
    path: Path  # the snapshot, which the trainer also trains from
    root: str  # hex BLAKE3 root over its pieces at the run's piece size, as every manifest lists it


def snapshot_task_file(task: str, into: Path, piece_size: int, prompt_key: str = "prompt",
                       answer_key: str = "answer") -> RunTaskFile | None:
    """Snapshot the run's task file into `into` (None for a built-in task set) and compute its manifest root.

    A .jsonl or .parquet file with the standard columns is copied byte for byte; any other source (a .json or
    .csv file, a hub dataset, columns named by prompt_key/answer_key) is written as a JSONL file of the standard
    columns, so every peer reads it with no column mapping and no Hugging Face cache of its own."""
    if is_builtin_task(task):
        return None
    plain = is_task_file(task) and task.endswith((".jsonl", ".parquet")) and (prompt_key, answer_key) == (
        "prompt", "answer")
    taskset = None if plain else load_tasks(task, prompt_key=prompt_key, answer_key=answer_key)
    name = Path(task).name if plain else f"{taskset.name}.jsonl"
    if not is_safe_file_name(name):
        raise UserError(f"the task file name {name!r} must be up to 128 letters, digits, '.', '_' or '-', "
                        f"starting with a letter or digit: it travels with every policy version under that name")
    if is_task_file(task) and not Path(task).is_file():
        raise UserError(f"task file {task} does not exist")
    into.mkdir(parents=True, exist_ok=True)
    snapshot, partial = into / name, into / f".{name}.partial"
    try:
        if plain:
            shutil.copyfile(task, partial)
        else:
            partial.write_text(standard_jsonl(taskset), encoding="utf-8")
        os.replace(partial, snapshot)
    except OSError as exc:
        partial.unlink(missing_ok=True)
        raise UserError(f"task file {task} could not be copied into the run's data directory "
                        f"({exc.strerror or exc})") from None
    return RunTaskFile(name, snapshot, file_entry(snapshot, piece_size).root.hex())


def standard_jsonl(taskset: TaskSet) -> str:
    """A task set as JSONL rows of prompt, answer, metadata and reward_fn, in index order."""
    rows = [{"prompt": e.prompt, "answer": e.answer, "metadata": dict(e.metadata), "reward_fn": e.reward_fn}
            for e in taskset]
    return "".join(json.dumps(row, sort_keys=True, default=str) + "\n" for row in rows)


def place_task_file(task_file: RunTaskFile, directory: Path) -> None:
    """Put the snapshot into a version's directory (a hard link: every version shares the one copy)."""
    target = directory / task_file.name
    if target.exists():
        return
    try:
        os.link(task_file.path, target)
    except OSError:  # another file system, or links not supported there
        shutil.copyfile(task_file.path, target)
