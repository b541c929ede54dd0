"""A run's task file travels with every policy version, so the peers of a run never have to be handed it.

Why: on a user dataset (JSONL or parquet) every inference peer and validator must read exactly the trainer's rows:
indices are what assignment, rollouts and votes agree on, and a volunteer with another copy (an older export, one
edited row) would see its honest work rejected and itself banned. So the trainer snapshots the file once, every
version's manifest lists it beside the weights (the same bytes have the same root, so a peer fetches it once and
holds it across versions), and the run spec names it by that root; peers read it from the version's directory,
reassembled from pieces verified against the signed manifest (swarm.policy.runspec.spec_tasks).
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from p2p.manifest import file_entry, is_safe_file_name
from swarm.errors import UserError
from tasks.loading import is_task_file


@dataclass(frozen=True)
class RunTaskFile:
    """The trainer's snapshot of the run's task file."""

    name: str  # its name in every version's directory (the original's, so the task set keeps its name)
    path: Path  # the snapshot, which the trainer also trains from
    root: str  # hex BLAKE3 root over its pieces at the run's piece size, as every manifest lists it


def snapshot_task_file(task: str, into: Path, piece_size: int) -> RunTaskFile | None:
    """Copy the task file `task` into `into` (None for a built-in task set) and compute its manifest root."""
    if not is_task_file(task):
        return None
    source = Path(task)
    if not is_safe_file_name(source.name):
        raise UserError(f"the task file name {source.name!r} must be up to 128 letters, digits, '.', '_' or '-', "
                        f"starting with a letter or digit: it travels with every policy version under that name")
    if not source.is_file():
        raise UserError(f"task file {source} does not exist")
    into.mkdir(parents=True, exist_ok=True)
    snapshot, partial = into / source.name, into / f".{source.name}.partial"
    try:
        shutil.copyfile(source, partial)
        os.replace(partial, snapshot)
    except OSError as exc:
        partial.unlink(missing_ok=True)
        raise UserError(f"task file {source} could not be copied into the run's data directory "
                        f"({exc.strerror or exc})") from None
    return RunTaskFile(source.name, snapshot, file_entry(snapshot, piece_size).root.hex())


def place_task_file(task_file: RunTaskFile, directory: Path) -> None:
    """Put the snapshot into a version's directory (a hard link: every version shares the one copy)."""
    target = directory / task_file.name
    if target.exists():
        return
    try:
        os.link(task_file.path, target)
    except OSError:  # another file system, or links not supported there
        shutil.copyfile(task_file.path, target)
