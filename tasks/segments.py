"""FastCuRL data segmentation by prompt length (arXiv 2503.17287, section 3).

Why the mean in characters: FastCuRL cuts its training set at the mean prompt length into short (L1) and long
(L3) prompts and trains on short prompts with a short context first; characters keep the cut independent of the
tokenizer, so every peer computes the same segments.
"""

from __future__ import annotations

from tasks.errors import TaskError
from tasks.taskset import TaskSet

SEGMENTS = ("short", "all", "long")


def mean_prompt_length(taskset: TaskSet) -> float:
    lengths = [len(e.prompt) for e in taskset]
    return sum(lengths) / len(lengths) if lengths else 0.0


def segment(taskset: TaskSet, which: str) -> list[int]:
    """Sorted dataset indices of a segment: "short" (<= mean length), "long" (> mean) or "all"."""
    if which not in SEGMENTS:
        raise TaskError(f"unknown data segment {which!r}; expected one of {', '.join(SEGMENTS)}")
    if which == "all":
        return taskset.indices()
    mean = mean_prompt_length(taskset)
    if which == "short":
        return [e.index for e in taskset if len(e.prompt) <= mean]
    return [e.index for e in taskset if len(e.prompt) > mean]
