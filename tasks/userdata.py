"""User datasets from JSONL, JSON, parquet or CSV files: a prompt column, an answer column, optional metadata.

Why strict: a malformed row silently skipped would shift every later index, and indices are what assignment,
rollouts and validators agree on; so any missing column or unreadable file is one clear error naming both.
Why a column mapping: public datasets name their columns their own way (GSM8K: question, answer; MATH: problem,
solution), so the prompt and answer columns are named by the caller (`prompt_key`, `answer_key`, as verl does)
instead of asking the user to rewrite the file.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Sequence
from pathlib import Path

from tasks.errors import TaskError
from tasks.taskset import TaskEntry, TaskSet

TASK_FILE_SUFFIXES = (".jsonl", ".json", ".parquet", ".csv")


def load_user_file(path: str | Path, *, reward_fn: str = "math", prompt_key: str = "prompt",
                   answer_key: str = "answer") -> TaskSet:
    """Load a task file; the set's name is the file's stem."""
    path = Path(path)
    if not path.is_file():
        raise TaskError(f"task file {path} does not exist")
    rows = read_rows(path)
    return rows_to_taskset(path.stem, rows, str(path), {"path": str(path)}, reward_fn=reward_fn,
                           prompt_key=prompt_key, answer_key=answer_key)


def rows_to_taskset(name: str, rows: Sequence[dict], where: str, spec: dict, *, reward_fn: str, prompt_key: str,
                    answer_key: str) -> TaskSet:
    """A task set of `rows` (their prompt and answer read from the mapped columns); `where` names them in errors."""
    if not rows:
        raise TaskError(f"task file {where} holds no rows")
    entries = [_entry(where, name, i, row, reward_fn, prompt_key, answer_key) for i, row in enumerate(rows)]
    keys = {} if (prompt_key, answer_key) == ("prompt", "answer") else {"prompt_key": prompt_key,
                                                                        "answer_key": answer_key}
    return TaskSet(name, entries, {"name": name, **spec, "size": len(entries), "reward_fn": reward_fn, **keys})


def read_rows(path: Path) -> list[dict]:
    """The rows of a task file, by its suffix."""
    readers = {".jsonl": _read_jsonl, ".json": _read_json, ".parquet": _read_parquet, ".csv": _read_csv}
    reader = readers.get(path.suffix)
    if reader is None:
        raise TaskError(f"task file {path} must end in {', '.join(TASK_FILE_SUFFIXES)}")
    return reader(path)


def _read_text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise TaskError(f"task file {path} cannot be read ({exc})") from None


def _read_jsonl(path: Path) -> list[dict]:
    rows = []
    for lineno, line in enumerate(_read_text(path).splitlines(), 1):
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


def _read_json(path: Path) -> list[dict]:
    """A JSON array of objects, or JSON lines under a .json name (how many hub datasets ship theirs)."""
    text = _read_text(path)
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        return _read_jsonl(path)  # several values: JSON lines (a line that is not JSON is named there)
    if isinstance(value, dict):
        value = [value]  # JSON lines holding one row
    if not isinstance(value, list) or not all(isinstance(row, dict) for row in value):
        raise TaskError(f"task file {path} must hold a JSON array of objects (or one object per line)")
    return value


def _read_csv(path: Path) -> list[dict]:
    try:
        with path.open(newline="", encoding="utf-8") as handle:
            return [dict(row) for row in csv.DictReader(handle)]
    except (OSError, UnicodeDecodeError, csv.Error) as exc:
        raise TaskError(f"task file {path} is not a readable CSV file ({exc})") from None


def _read_parquet(path: Path) -> list[dict]:
    try:
        import pyarrow.parquet as pq  # imported here so JSONL-only users never load it
    except ImportError:
        raise TaskError(
            f"reading {path} needs pyarrow, which is not installed (pip install pyarrow, or convert it to JSONL)"
        ) from None

    try:
        return pq.read_table(path).to_pylist()
    except Exception as exc:  # noqa: BLE001 - any pyarrow failure means the file is unreadable
        raise TaskError(f"task file {path} is not a readable parquet file ({type(exc).__name__})") from None


def _entry(where: str, name: str, i: int, row: dict, reward_fn: str, prompt_key: str, answer_key: str) -> TaskEntry:
    for column in (prompt_key, answer_key):
        if row.get(column) is None:
            present = ", ".join(str(k) for k in row) or "none"
            hint = " (choose the columns with --prompt-key and --answer-key)" if column in ("prompt", "answer") else ""
            raise TaskError(f"task file {where} row {i} has no {column!r} column (its columns: {present}){hint}")
    metadata = row.get("metadata") or {}
    if not isinstance(metadata, dict):
        raise TaskError(f"task file {where} row {i} has a 'metadata' column that is not an object")
    return TaskEntry(dataset=name, index=i, prompt=str(row[prompt_key]), answer=final_answer(str(row[answer_key])),
                     metadata=metadata, reward_fn=str(row.get("reward_fn") or reward_fn))


def final_answer(answer: str) -> str:
    """The reference answer a reward compares with: GSM8K's answers are worked solutions ending in "#### 72"
    (verl's GSM8K preprocessing keeps what follows the marker), so the text after the last "####", without
    thousands separators; any other answer as it is."""
    if "####" not in answer:
        return answer
    return answer.rsplit("####", 1)[1].strip().replace(",", "")
