"""The validator's TaskProvider over the run's task sets (tasks/) and the policy's tokenizer.

Why an adapter: the checks only need three questions answered (how is task i rendered, what is its entry, what
text do these tokens decode to) and must ask them exactly as workers do, so this delegates to the same
tasks.prompts functions inference uses (render_prompt_tokens, decode_completion).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from tasks.prompts import decode_completion, render_prompt_tokens
from tasks.taskset import TaskSet


class TaskSetProvider:
    """Answers for task sets keyed by name; an unknown dataset or index answers None."""

    def __init__(self, tasksets: Mapping[str, TaskSet], tokenizer) -> None:
        self.tasksets = dict(tasksets)
        self.tokenizer = tokenizer
        self._rendered: dict[tuple[str, int], tuple[int, ...]] = {}

    def _entry(self, dataset: str, index: int):
        taskset = self.tasksets.get(dataset)
        if taskset is None or index not in taskset:
            return None
        return taskset[index]

    def prompt_tokens(self, dataset: str, index: int) -> Sequence[int] | None:
        key = (dataset, index)
        if key not in self._rendered:
            entry = self._entry(dataset, index)
            if entry is None:
                return None
            self._rendered[key] = tuple(render_prompt_tokens(self.tokenizer, entry))
        return self._rendered[key]

    def entry(self, dataset: str, index: int) -> dict | None:
        entry = self._entry(dataset, index)
        return None if entry is None else entry.to_dict()

    def decode(self, tokens: Sequence[int]) -> str:
        return decode_completion(self.tokenizer, tokens)
