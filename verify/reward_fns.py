"""The reward functions themselves: pure, and safe on hostile text; verify/rewards.py decides where each runs.

Why shared: a validator recomputes every claimed reward with exactly the code the worker should have run, so the
two sides must agree bit for bit; every function returns a float in [0, 1]. A hostile completion (the validator
runs these on untrusted text) can still make math-verify or a reasoning-gym scorer raise or hang, so callers go
through verify/rewards.py, which runs them where that costs only the completion's own score. Why a module of its
own: the scorer process (verify/scorer_worker.py) runs these functions and verify/rewards.py starts that process,
so both build on this one.

Answer extraction rule (`extract_answer`), first that applies, on the completion's last 4,000 characters:
  1. the content of the last balanced \\boxed{...};
  2. the text after the last "Answer:" (case-insensitive), up to the end of its line;
  3. the last number (integer, decimal or fraction, optional sign, thousands commas allowed);
  4. the last non-empty line.
The extracted answer is capped at 256 characters before any parser sees it, which bounds the parser's work.

Registry names: "exact" (normalised string equality), "numeric" (numbers equal within 1e-6 relative), "math"
(math-verify equivalence), "rg:<name>" (the reasoning-gym dataset's own scorer). Any other name with a ':' is a
run's own reward (module:function or path/to/file.py:function, verify/reward_loading.py). Each is called in TRL's
reward_funcs shape (`resolve`).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from fractions import Fraction

from verify.reward_loading import call_reward, is_custom_reward, load_reward

_TAIL_CHARS = 4000
_ANSWER_CAP = 256
_NUMBER = re.compile(r"[-+]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:\s*/\s*\d+)?|[-+]?\.\d+")
_ANSWER_TAG = re.compile(r"answer\s*:", re.IGNORECASE)

RewardFn = Callable[[str, dict], float]
"""One completion and its task entry -> its reward."""
BatchRewardFn = Callable[..., list[float]]
"""TRL's reward_funcs shape: completions and the row's fields as keyword lists -> one reward per completion."""


def extract_answer(text: str) -> str:
    """The final answer of a completion by the rule in the module docstring ('' when there is none)."""
    if not isinstance(text, str):
        return ""
    tail = text[-_TAIL_CHARS:]
    for rule in (_last_boxed, _after_answer_tag, _last_number, _last_line):
        found = rule(tail)
        if found:
            return found.strip()[:_ANSWER_CAP]
    return ""


def _last_boxed(text: str) -> str:
    start = text.rfind("\\boxed{")
    if start < 0:
        return ""
    depth, i = 0, start + len("\\boxed")
    for j in range(i, len(text)):
        if text[j] == "{":
            depth += 1
        elif text[j] == "}":
            depth -= 1
            if depth == 0:
                return text[i + 1 : j]
    return ""


def _after_answer_tag(text: str) -> str:
    matches = list(_ANSWER_TAG.finditer(text))
    if not matches:
        return ""
    return text[matches[-1].end() :].split("\n", 1)[0].strip()


def _last_number(text: str) -> str:
    numbers = _NUMBER.findall(text)
    return numbers[-1] if numbers else ""


def numbers_in(text: str) -> list[str]:
    """Every number of rule 3 in the completion's last 4,000 characters, in order (what a reading of the answer
    other than the registry's, such as `swarm eval --lenient`, chooses from)."""
    return _NUMBER.findall(text[-_TAIL_CHARS:]) if isinstance(text, str) else []


def _last_line(text: str) -> str:
    lines = [line for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else ""


def _normalise(text: str) -> str:
    return " ".join(str(text).strip().strip(".").split()).lower()


def parse_number(text: str) -> Fraction | None:
    """An exact rational from '1,234', '-3.5', '7/2', '$12' or '12.' (None when it is not one number)."""
    cleaned = str(text).strip().strip("$").rstrip(".").replace(",", "").replace(" ", "")
    if not cleaned or len(cleaned) > 64:
        return None
    try:
        return Fraction(cleaned)
    except (ValueError, ZeroDivisionError):
        return None


def reward_exact(completion: str, entry: dict) -> float:
    return float(_normalise(extract_answer(completion)) == _normalise(entry.get("answer", "")))


def reward_numeric(completion: str, entry: dict) -> float:
    got, want = parse_number(extract_answer(completion)), parse_number(entry.get("answer", ""))
    if got is None or want is None:
        return 0.0
    return float(abs(got - want) <= Fraction(1, 10**6) * max(1, abs(want)))


def reward_math(completion: str, entry: dict) -> float:
    """math-verify equivalence of the extracted answer and the task's answer (run it through compute_reward, which
    isolates it in the scorer process)."""
    import math_verify

    answer = extract_answer(completion)
    gold = str(entry.get("answer", ""))[:_ANSWER_CAP]
    if not answer or not gold:
        return 0.0
    parsed_gold = math_verify.parse(f"${gold}$", parsing_timeout=1)
    parsed = math_verify.parse(f"${answer}$", parsing_timeout=1)
    return float(bool(math_verify.verify(parsed_gold, parsed, timeout_seconds=1)))


@functools.lru_cache(maxsize=64)
def _rg_dataset(name: str):
    import reasoning_gym

    return reasoning_gym.create_dataset(name, size=1, seed=0)


def reward_reasoning_gym(name: str, completion: str, entry: dict) -> float:
    """The named reasoning-gym dataset's scorer on the extracted answer (its entry: question, answer, metadata)."""
    rg_entry = {"question": entry.get("prompt", entry.get("question", "")), "answer": entry.get("answer", ""),
                "metadata": entry.get("metadata") or {}}
    return float(_rg_dataset(name).score_answer(extract_answer(completion), rg_entry))


REGISTRY: dict[str, RewardFn] = {"exact": reward_exact, "numeric": reward_numeric, "math": reward_math}
"""The built-in scorers of one completion against its task entry."""


def batch_reward(score: RewardFn) -> BatchRewardFn:
    """`score` in TRL's reward_funcs shape (verify/reward_loading.py), so a built-in and a run's own reward are
    called the same way: row i of the task is the i-th value of every keyword list."""
    def reward(completions: list[str], **row_fields: list) -> list[float]:
        rows = [dict(zip(row_fields, values)) for values in zip(*row_fields.values())] or [{}] * len(completions)
        return [score(completion, row) for completion, row in zip(completions, rows)]

    reward.__name__ = getattr(score, "__name__", "reward")
    return reward


BUILTIN_REWARDS: dict[str, BatchRewardFn] = {name: batch_reward(fn) for name, fn in REGISTRY.items()}
"""The registry's scorers in the reward_funcs shape."""


def is_known(reward_fn: str) -> bool:
    """True for a registry name, 'rg:<dataset>' naming an installed reasoning-gym dataset, or a custom reward
    (module:function) that loads."""
    if reward_fn in REGISTRY:
        return True
    try:
        resolve(reward_fn)
        return True
    except Exception:  # noqa: BLE001 - an unknown dataset or a reward that does not load is just unknown
        return False


def resolve(reward_fn: str) -> BatchRewardFn:
    """The reward_funcs-shaped function a reward name stands for: a built-in, "rg:<dataset>"'s scorer, or a run's
    own module:function (loaded once per process; verify/reward_loading.py checks its hash where a run names one).
    Raises KeyError for a name that is none of these, RewardError for a custom reward that does not load."""
    if reward_fn in BUILTIN_REWARDS:
        return BUILTIN_REWARDS[reward_fn]
    if isinstance(reward_fn, str) and reward_fn.startswith("rg:"):
        _rg_dataset(reward_fn[3:])
        return _rg_reward(reward_fn[3:])
    if is_custom_reward(reward_fn):
        return load_reward(reward_fn).fn
    raise KeyError(reward_fn)


@functools.lru_cache(maxsize=64)
def _rg_reward(name: str) -> BatchRewardFn:
    return batch_reward(functools.partial(reward_reasoning_gym, name))


def score_direct(reward_fn: str, completion: str, entry: dict) -> float:
    """The named reward function on `completion`, in this process (0.0 for an unknown name); it may raise or
    take unbounded time on hostile text, so callers isolate it (verify/rewards.py says how)."""
    try:
        fn = resolve(reward_fn)
    except KeyError:
        return 0.0
    return call_reward(fn, reward_fn, [completion], entry)[0]
