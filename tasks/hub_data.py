"""Hugging Face hub datasets as task sets, read from the local Hugging Face cache (never downloaded).

A dataset is named `ORG/NAME` (its train split) or, as pandas, polars and duckdb spell a file of the hub,
`hf://datasets/ORG/NAME[@REVISION]/PATH`, where PATH picks a subset directory or one file. Why no `datasets`
package: a cached dataset is a directory of parquet, JSON or CSV files, which tasks/userdata.py already reads,
and the `datasets` package would add a large dependency (and its own cache) for nothing a run needs.
Why the train split by default: a run sets its own held-out prompts aside (TaskSet.split), from the same split
`swarm train` and `swarm eval` both read.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from tasks.errors import TaskError
from tasks.hub_cache import HubReference, NotCached, cached_snapshot, fetch_hint, hub_cache_dir, parse_reference
from tasks.taskset import TaskSet
from tasks.userdata import TASK_FILE_SUFFIXES, read_rows, rows_to_taskset

HF_URI_PREFIX = "hf://datasets/"
DEFAULT_SPLIT = "train"


@dataclass(frozen=True)
class HubDataset:
    """A dataset named on the command line: the repository and a path inside its snapshot ("" = all of it)."""

    reference: HubReference
    inner_path: str = ""


def parse_hub_dataset(name: str) -> HubDataset | None:
    """The hub dataset `name` names, or None when it names none (a built-in task, a local path)."""
    if name.startswith(HF_URI_PREFIX):
        parts = name[len(HF_URI_PREFIX):].split("/")
        reference = parse_reference("/".join(parts[:2])) if len(parts) >= 2 else None
        inner = "/".join(parts[2:])
        if reference is None or any(part in ("", ".", "..") for part in parts[2:]):
            raise TaskError(f"{name!r} is not a hub dataset address of the form hf://datasets/ORG/NAME[/PATH]")
        return HubDataset(reference, inner)
    if name.count("/") != 1 or name.endswith(TASK_FILE_SUFFIXES) or Path(name).exists():
        return None
    reference = parse_reference(name)
    return HubDataset(reference) if reference is not None else None


def load_hub_dataset(dataset: HubDataset, *, reward_fn: str, prompt_key: str, answer_key: str) -> TaskSet:
    """The task set of a cached hub dataset's files (their rows concatenated in file-name order), named by the
    repository's name so rollouts and reports read "gsm8k", not a commit hash."""
    files = dataset_files(dataset)
    rows = [row for path in files for row in read_rows(path)]
    where = f"{_address(dataset)} ({', '.join(p.name for p in files)})"
    spec = {"hub": str(dataset.reference), "path": dataset.inner_path, "commit": _snapshot_of(files[0]).name}
    return rows_to_taskset(dataset.reference.name, rows, where, spec, reward_fn=reward_fn, prompt_key=prompt_key,
                           answer_key=answer_key)


def dataset_files(dataset: HubDataset) -> list[Path]:
    """The data files a dataset reference means: a named file, or the train split's files under a directory."""
    try:
        snapshot = cached_snapshot(dataset.reference, "dataset")
    except NotCached:
        raise TaskError(f"dataset {str(dataset.reference)!r} is not in the local Hugging Face cache "
                        f"({hub_cache_dir()}): fetch it with `{fetch_hint(dataset.reference, 'dataset')}` on a "
                        f"machine with network and copy that cache here (or point HF_HUB_CACHE at it)") from None
    target = snapshot / dataset.inner_path if dataset.inner_path else snapshot
    if target.is_file():
        return [target]
    if not target.is_dir():
        raise TaskError(f"dataset {str(dataset.reference)!r} has no {dataset.inner_path!r} in its cached snapshot")
    return _split_files(dataset, target)


def _split_files(dataset: HubDataset, directory: Path) -> list[Path]:
    """The train split's files under `directory`: every data file when there is one, else those named for the
    split (train.jsonl, train-00000-of-00002.parquet, train/...), all from one subset directory."""
    found = sorted(p for p in directory.rglob("*") if p.suffix in TASK_FILE_SUFFIXES and not _hidden(p, directory))
    if len(found) == 1:
        return found
    split = [p for p in found if _in_split(p.relative_to(directory))]
    subsets = sorted({str(p.parent.relative_to(directory)) for p in split})
    if not split:
        shown = ", ".join(str(p.relative_to(directory)) for p in found[:6]) or "none"
        raise TaskError(f"{_address(dataset)} has no {DEFAULT_SPLIT} split among its data files ({shown}): name "
                        f"one as {_address(dataset)}/FILE")
    if len(subsets) > 1:
        raise TaskError(f"{_address(dataset)} holds several subsets ({', '.join(subsets)}): name one as "
                        f"{_address(dataset)}/{subsets[0]}")
    if len({p.suffix for p in split}) > 1:
        raise TaskError(f"{_address(dataset)} mixes file formats in its {DEFAULT_SPLIT} split: name one file")
    return split


def _in_split(relative: Path) -> bool:
    stem = relative.name.split(".")[0]
    return stem == DEFAULT_SPLIT or stem.startswith((f"{DEFAULT_SPLIT}-", f"{DEFAULT_SPLIT}_")) or \
        DEFAULT_SPLIT in relative.parts[:-1]


def _hidden(path: Path, root: Path) -> bool:
    return any(part.startswith(".") for part in path.relative_to(root).parts)


def _snapshot_of(path: Path) -> Path:
    """The snapshot directory holding `path` (its parent named by a commit under snapshots/)."""
    for parent in path.parents:
        if parent.parent.name == "snapshots":
            return parent
    return path.parent


def _address(dataset: HubDataset) -> str:
    base = f"{HF_URI_PREFIX}{dataset.reference.repo_id}"
    if dataset.reference.revision != "main":
        base += f"@{dataset.reference.revision}"
    return f"{base}/{dataset.inner_path}" if dataset.inner_path else base
