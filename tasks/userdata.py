"""User datasets from JSONL or parquet files: columns prompt, answer and an optional metadata object.

Why strict: a malformed row silently skipped would shift every later index, and indices are what assignment,
rollouts and validators agree on; so any missing column or unreadable file is one clear error naming both.
"""

from __future__ import annotations

import json
from pathlib import Path

from tasks.errors import TaskError
from tasks.taskset import TaskEntry, TaskSet

REQUIRED_COLUMNS = ("prompt", "answer")


def load_user_file(path: str | Path, *, reward_fn: str = "math") -> TaskSet:
    """Load a .jsonl or .parquet task file; the set's name is the file's stem."""
    path = Path(path)
    if not path.is_file():
        raise TaskError(f"task file {path} does not exist")
    if path.suffix == ".jsonl":
        rows = _read_jsonl(path)
    elif path.suffix == ".parquet":
        rows = _read_parquet(path)
    else:
        raise TaskError(f"task file {path} must end in .jsonl or .parquet")
    if not rows:
        raise TaskError(f"task file {path} holds no rows")
    name = path.stem
    entries = [_entry(path, name, i, row, reward_fn) for i, row in enumerate(rows)]
    return TaskSet(name, entries, {"name": name, "path": str(path), "size": len(entries), "reward_fn": reward_fn})


def _read_jsonl(path: Path) -> list[dict]:
    rows = []
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise TaskError(f"task file {path} cannot be read ({exc})") from None
    for lineno, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise TaskError(f"task file {path} line {lineno} is not valid JSON ({exc.msg})") from None
        if not isinstance(row, dict):
            raise TaskError(f"task file {path} line {lineno} is not a JSON object")
        rows.append(row)
    return rows


def _read_parquet(path: Path) -> list[dict]:
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise TaskError(
            f"reading {path} needs pyarrow, which is not installed (pip install pyarrow, or convert it to JSONL)"
        ) from None
    try:
        return pq.read_table(path).to_pylist()
    except Exception as exc:  # noqa: BLE001 - any pyarrow failure means the file is unreadable
        raise TaskError(f"task file {path} is not a readable parquet file ({type(exc).__name__})") from None


def _entry(path: Path, name: str, i: int, row: dict, reward_fn: str) -> TaskEntry:
    for column in REQUIRED_COLUMNS:
        if row.get(column) is None:
            raise TaskError(f"task file {path} row {i} has no {column!r} column")
    metadata = row.get("metadata") or {}
    if not isinstance(metadata, dict):
        raise TaskError(f"task file {path} row {i} has a 'metadata' column that is not an object")
    return TaskEntry(dataset=name, index=i, prompt=str(row["prompt"]), answer=str(row["answer"]),
                     metadata=metadata, reward_fn=str(row.get("reward_fn") or reward_fn))
