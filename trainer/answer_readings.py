"""Readings of a completion's number besides the reward's, which tell answer form from arithmetic skill.

The reward reads the answer by one fixed rule within the trainer's generation limit, so a completion whose right
number comes after the limit scores 0, the same as a wrong one. A held-out gain at that limit can then be the policy
learning to state its number sooner (form) rather than learning to compute it (skill). Scored with a generous limit
(`swarm eval --lenient --max-new-tokens 96`), two readings separate the two:

  last_number: the last number the completion states is the expected one (the reward's rule 3 alone: no \\boxed{}
      or "Answer:" comes first). A completion that states the result and then goes on to other numbers ("88 + 94 =
      182. Check: 182 - 94 = 88") fails it, as it fails the reward.
  any_number: the expected number is one of the numbers the completion states, anywhere. An upper bound on what
      the model computes: it also credits a number stated and then revised, or one that happens to be an operand.

Numbers are whole numbers of the reward's rule 3 ("182" is not read in "1823"), compared as exact rationals within
the numeric reward's tolerance; an entry whose answer is not a number reads as wrong under both.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction

from verify.reward_fns import numbers_in, parse_number

SOLVED = 1.0 - 1e-9  # a completion counts as correct when its reward is 1
READINGS = ("reward", "last_number", "any_number")
"""The per-prompt verdicts an evaluation reports: the task's own reward, then the two lenient readings."""


def _same(number: str, want: Fraction | None) -> bool:
    got = parse_number(number)
    return got is not None and want is not None and abs(got - want) <= Fraction(1, 10**6) * max(1, abs(want))


def last_number_correct(text: str, answer: str) -> bool:
    """Whether the last number `text` states is `answer`."""
    numbers = numbers_in(text)
    return bool(numbers) and _same(numbers[-1], parse_number(answer))


def any_number_correct(text: str, answer: str) -> bool:
    """Whether any number `text` states is `answer`."""
    want = parse_number(answer)
    return any(_same(number, want) for number in numbers_in(text))


@dataclass(frozen=True)
class PromptOutcome:
    """One held-out prompt's greedy completion and its verdict under every reading."""

    index: int  # the prompt's index in the task set (the pairing key between two policies' evaluations)
    answer: str  # the task's expected answer
    text: str  # the decoded completion
    tokens: int  # completion length in tokens
    reward: float  # the task's own reward of `text`
    last_number: bool
    any_number: bool

    @property
    def correct(self) -> bool:
        return self.reward >= SOLVED

    def verdict(self, reading: str) -> bool:
        return self.correct if reading == "reward" else getattr(self, reading)

    def to_dict(self) -> dict:
        return {"index": self.index, "answer": self.answer, "text": self.text, "tokens": self.tokens,
                "reward": self.reward, "correct": self.correct, "last_number": self.last_number,
                "any_number": self.any_number}


def outcome(index: int, answer: str, text: str, tokens: int, reward: float) -> PromptOutcome:
    """The outcome of one completion, read every way."""
    return PromptOutcome(index, answer, text, tokens, reward, last_number_correct(text, answer),
                         any_number_correct(text, answer))


def reading_accuracy(outcomes: Sequence[PromptOutcome], reading: str) -> float:
    """Share of `outcomes` correct under `reading` (0 for none)."""
    return sum(o.verdict(reading) for o in outcomes) / max(len(outcomes), 1)
