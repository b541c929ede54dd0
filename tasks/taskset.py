"""Task entries and task sets: the prompts a run trains and evaluates on.

Why entries are keyed by their dataset index rather than their position: the assignment (tasks/assignment.py),
the rollout wire format and the validators all name a prompt by its index in the full dataset, so a split or a
curriculum segment is a subset of indices that still looks prompts up by those same indices.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType

import blake3

from tasks.errors import TaskError


@dataclass(frozen=True)
class TaskEntry:
    """One prompt with its reference answer.

    dataset: name of the task set it belongs to; index: its index in the full dataset (stable across splits);
    prompt: the question text, without chat template or answer-format instruction; answer: the reference answer;
    metadata: whatever the task's scorer needs (reasoning-gym puts its generator's parameters here);
    reward_fn: the verify.rewards registry entry that scores it ("exact", "numeric", "math", "rg:<name>").
    """

    dataset: str
    index: int
    prompt: str
    answer: str
    metadata: Mapping = field(default_factory=dict, hash=False)
    reward_fn: str = "math"

    def to_dict(self) -> dict:
        """The wire/scorer form: reasoning-gym scorers read "question", "answer" and "metadata"."""
        return {
            "dataset": self.dataset, "index": self.index, "question": self.prompt, "prompt": self.prompt,
            "answer": self.answer, "metadata": dict(self.metadata), "reward_fn": self.reward_fn,
        }


class TaskSet:
    """An immutable collection of TaskEntry, looked up by dataset index.

    For a freshly loaded set the indices are 0..n-1, so `taskset[i]` is both the i-th and the index-i entry.
    `spec` records how the set was made (name, size, seed, difficulty config) so another peer can rebuild it.
    """

    def __init__(self, name: str, entries: list[TaskEntry], spec: Mapping | None = None) -> None:
        self.name = name
        self._by_index = {e.index: e for e in entries}
        if len(self._by_index) != len(entries):
            raise TaskError(f"task set {name!r} holds duplicate indices")
        self._indices = sorted(self._by_index)
        self.spec = MappingProxyType(dict(spec or {"name": name}))

    def __len__(self) -> int:
        return len(self._indices)

    def __getitem__(self, index: int) -> TaskEntry:
        try:
            return self._by_index[index]
        except KeyError:
            raise KeyError(f"task set {self.name!r} has no prompt with index {index}") from None

    def __contains__(self, index: object) -> bool:
        return index in self._by_index

    def __iter__(self) -> Iterator[TaskEntry]:
        return (self._by_index[i] for i in self._indices)

    def indices(self) -> list[int]:
        """The dataset indices in this set, sorted (the canonical order assignment expects)."""
        return list(self._indices)

    def with_reward(self, reward_fn: str) -> "TaskSet":
        """The same prompts, each scored by `reward_fn` (a run's own reward replaces every entry's scorer)."""
        entries = [replace(e, reward_fn=reward_fn) for e in self]
        return TaskSet(self.name, entries, {**self.spec, "reward_fn": reward_fn})

    def subset(self, indices: list[int], suffix: str = "") -> "TaskSet":
        """A set holding only `indices` (each must be present); the name is kept so rollouts still match."""
        return TaskSet(self.name, [self[i] for i in sorted(set(indices))], {**self.spec, "subset": suffix or "custom"})

    def split(self, eval_fraction: float, seed: int = 0) -> tuple["TaskSet", "TaskSet"]:
        """(train, heldout): a seeded split by prompt text, never overlapping, the same on every machine.

        Why by text, not by index: procedural tasks with small number ranges repeat questions (gcd up to 50,
        one-digit arithmetic), and a held-out question that also sits in the training split measures memory, not
        skill. Each distinct prompt is ranked by BLAKE3(seed, prompt) and whole prompts (every index carrying that
        text) are held out, lowest rank first, until at least round(n * eval_fraction) indices are; the split
        depends on nothing but the seed and the texts (not on a library's RNG).
        """
        if not 0.0 <= eval_fraction < 1.0:
            raise TaskError(f"eval_fraction must be in [0, 1), got {eval_fraction}")
        by_text: dict[str, list[int]] = {}
        for i in self._indices:
            by_text.setdefault(self._by_index[i].prompt.strip(), []).append(i)
        ranked = sorted(by_text, key=lambda text: blake3.blake3(f"split-v2\x00{seed}\x00{text}".encode()).digest())
        k, heldout = round(len(self._indices) * eval_fraction), set()
        for text in ranked:
            if len(heldout) >= k:
                break
            heldout.update(by_text[text])
        train = [i for i in self._indices if i not in heldout]
        return self.subset(train, "train"), self.subset(sorted(heldout), "heldout")
