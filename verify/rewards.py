"""Reward functions shared by inference (claimed rewards) and validators (recomputed rewards).

Why shared: a validator recomputes every claimed reward with exactly the code the worker should have run, so the
two sides must agree bit for bit; every function returns a float in [0, 1] and never raises, whatever a hostile
completion holds (the validator runs it on untrusted text).

Answer extraction rule (`extract_answer`), first that applies, on the completion's last 4,000 characters:
  1. the content of the last balanced \\boxed{...};
  2. the text after the last "Answer:" (case-insensitive), up to the end of its line;
  3. the last number (integer, decimal or fraction, optional sign, thousands commas allowed);
  4. the last non-empty line.
The extracted answer is capped at 256 characters before any parser sees it, which bounds the parser's work.

Registry names: "exact" (normalised string equality), "numeric" (numbers equal within 1e-6 relative), "math"
(math-verify equivalence), "rg:<name>" (the reasoning-gym dataset's own scorer).
"""

from __future__ import annotations

import functools
import math
import os
import re
import threading
import time
from collections.abc import Callable, Sequence
from fractions import Fraction

_TAIL_CHARS = 4000
_ANSWER_CAP = 256
_SCORER_TIMEOUT_S = 5.0
_SCORER_START_S = 120.0
_NUMBER = re.compile(r"[-+]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:\s*/\s*\d+)?|[-+]?\.\d+")
_ANSWER_TAG = re.compile(r"answer\s*:", re.IGNORECASE)

RewardFn = Callable[[str, dict], float]


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


class _ScorerWorker:
    """One lazily started scorer process shared by all threads (calls are serialised by a lock).

    Why a process: math-verify's own timeouts use SIGALRM (main thread only), and sympy or a reasoning-gym scorer
    can spend unbounded time in C code holding the GIL (e.g. \\boxed{10^{10^{10^{10}}}}), which no thread-based
    timeout can interrupt. A scorer that misses the deadline is killed and replaced, and the answer scores 0.
    """

    def __init__(self, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        self._lock = threading.Lock()
        self._process = None
        self._ready = False  # the launched process has said "R" (its imports are done)

    def score(self, reward_fn: str, completion: str, entry: dict) -> float:
        return self.score_many(reward_fn, [completion], entry)[0]

    def score_many(self, reward_fn: str, completions: list[str], entry: dict) -> list[float]:
        """One round trip for every completion of a group (a round trip costs more than an arithmetic scorer).

        The batch shares one deadline; if it is missed (or the scorer dies), the completions are scored again one
        at a time, so a hostile completion scores 0 alone and never takes its group's honest ones with it.
        """
        with self._lock:
            values = self._exchange([(reward_fn, completions, entry)])
        if values is not None:
            return values
        if len(completions) == 1:
            return [0.0]
        return [self.score_many(reward_fn, [completion], entry)[0] for completion in completions]

    def score_jobs(self, jobs: list[tuple[str, list[str], dict]]) -> list[list[float]]:
        """score_many of many groups in one round trip (a validator's batch), under one shared deadline; if it is
        missed, each group is scored on its own (score_many), so a hostile group costs its own deadlines only."""
        if len(jobs) == 1:
            return [self.score_many(*jobs[0])]
        with self._lock:
            values = self._exchange(jobs)
        if values is None:
            return [self.score_many(*job) for job in jobs]
        out, at = [], 0
        for _, completions, _ in jobs:
            out.append(values[at:at + len(completions)])
            at += len(completions)
        return out

    def start_soon(self) -> None:
        """Launch the scorer process without waiting for it: its imports overlap whatever the caller does next."""
        with self._lock:
            self._launch_if_needed()

    def _exchange(self, jobs: list[tuple[str, list[str], dict]]) -> list[float] | None:
        """One frame of (reward_fn, completions, entry) jobs out, every completion's score back, in order; None
        when the deadline passes or the scorer fails (it is then stopped, and relaunched by the next call)."""
        import pickle
        import struct

        count = sum(len(completions) for _, completions, _ in jobs)
        try:
            self._launch_if_needed()
            if not self._ready:
                self._await_ready()
            body = pickle.dumps(jobs)
            self._process.stdin.write(struct.pack(">I", len(body)) + body)
            self._process.stdin.flush()
            reply = self._read(8 * count, self.timeout_s)
            if reply is not None:
                return list(struct.unpack(f">{count}d", reply))
        except (OSError, ValueError, pickle.PicklingError):
            pass
        self._stop()
        return None

    def _read(self, n: int, timeout_s: float) -> bytes | None:
        """n bytes from the scorer within timeout_s (select on the pipe), else None."""
        import os
        import select

        fd, data = self._process.stdout.fileno(), b""
        deadline = time.monotonic() + timeout_s
        while len(data) < n:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                return None
            chunk = os.read(fd, n - len(data))
            if not chunk:
                return None
            data += chunk
        return data

    def _launch_if_needed(self) -> None:
        """Launch a scorer unless a live one exists; it says "R" when ready (_await_ready waits for that)."""
        if self._process is None or self._process.poll() is not None:
            self._ready = False
            self._process = self._launch()

    @staticmethod
    def _launch():
        import subprocess
        import sys
        from pathlib import Path

        from verify.scorer_worker import ForkedScorer, fork_is_safe

        if fork_is_safe():
            return ForkedScorer()

        # The child must import this very package, installed or not: put its parent directory first on the path.
        root = str(Path(__file__).resolve().parent.parent)
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")])))
        return subprocess.Popen([sys.executable, "-m", "verify.scorer_worker"], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env)

    def _await_ready(self) -> None:
        if self._read(1, _SCORER_START_S) != b"R":
            self._stop()
            raise OSError("reward scorer process did not start")
        self._ready = True

    def _stop(self) -> None:
        if self._process is not None:
            self._process.kill()
            self._process.wait()
            for stream in (self._process.stdin, self._process.stdout):
                stream.close()
        self._process = None

    def forget_after_fork(self) -> None:
        """In a forked child: the scorer process and its pipes belong to the parent; start a fresh one when needed."""
        self._lock = threading.Lock()
        self._process = None
        self._ready = False


_SCORER = _ScorerWorker(timeout_s=_SCORER_TIMEOUT_S)
os.register_at_fork(after_in_child=_SCORER.forget_after_fork)


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
# Pure-Python scorers with bounded work (inputs capped at 256 characters) run in the caller's process.
_IN_PROCESS = frozenset({"exact", "numeric"})


def is_known(reward_fn: str) -> bool:
    """True for a registry name or 'rg:<dataset>' naming an installed reasoning-gym dataset."""
    if reward_fn in REGISTRY:
        return True
    if isinstance(reward_fn, str) and reward_fn.startswith("rg:"):
        try:
            _rg_dataset(reward_fn[3:])
            return True
        except Exception:  # noqa: BLE001 - an unknown dataset name is just unknown
            return False
    return False


def _score_direct(reward_fn: str, completion: str, entry: dict) -> float:
    if reward_fn.startswith("rg:"):
        return reward_reasoning_gym(reward_fn[3:], completion, entry)
    fn = REGISTRY.get(reward_fn)
    return fn(completion, entry) if fn is not None else 0.0


def start_scorer(reward_fns) -> None:
    """Start the scorer process now when any of `reward_fns` runs in it, without waiting for its imports (about
    2 s): a process that will score (a generator, a validator) overlaps them with its own start-up."""
    if any(isinstance(fn, str) and fn not in _IN_PROCESS for fn in reward_fns):
        _SCORER.start_soon()


def compute_reward(reward_fn: str, completion_text: str, entry: dict) -> float:
    """The reward in [0, 1] of `completion_text` for task `entry` (a TaskEntry wire dict); never raises.

    "exact" and "numeric" run here; "math" and "rg:*" run in the scorer process under a deadline. An unknown
    reward function, a scorer that raises or times out, or a non-finite score all give 0.0.
    """
    return compute_rewards(reward_fn, [completion_text], entry)[0]


def compute_rewards(reward_fn: str, completion_texts: list[str], entry: dict) -> list[float]:
    """compute_reward of each text for one task entry, with one scorer round trip for all (a group's completions).

    Never raises; every value is in [0, 1], and a text that is not a string scores 0.0 without touching the others.
    """
    return compute_rewards_many([(reward_fn, completion_texts, entry)])[0]


def compute_rewards_many(jobs: Sequence[tuple[str, Sequence[str], dict]]) -> list[list[float]]:
    """compute_rewards of many (reward_fn, texts, entry) jobs, with one scorer round trip for all those scored out
    of process: a validator scores its whole batch at once (a round trip costs more than an arithmetic scorer)."""
    values: list[list[float]] = []
    remote: list[tuple[int, list[int]]] = []  # (job, its valid text indices) scored in the scorer process
    for reward_fn, completion_texts, entry in jobs:
        texts = list(completion_texts)
        values.append([0.0] * len(texts))
        if not isinstance(entry, dict) or not isinstance(reward_fn, str):
            continue
        valid = [i for i, text in enumerate(texts) if isinstance(text, str)]
        if reward_fn in _IN_PROCESS:
            for i in valid:
                values[-1][i] = _clamped(_direct_or_zero(reward_fn, texts[i], entry))
        elif (reward_fn in REGISTRY or reward_fn.startswith("rg:")) and valid:
            remote.append((len(values) - 1, valid))
    if remote:
        try:
            requests = [(jobs[j][0], [jobs[j][1][i] for i in valid], jobs[j][2]) for j, valid in remote]
            scored = _SCORER.score_jobs(requests)
        except Exception:  # noqa: BLE001 - hostile text must never crash a validator
            scored = [[0.0] * len(valid) for _, valid in remote]
        for (j, valid), group_scores in zip(remote, scored):
            for i, value in zip(valid, group_scores):
                values[j][i] = _clamped(value)
    return values


def _direct_or_zero(reward_fn: str, text: str, entry: dict) -> float:
    try:
        return _score_direct(reward_fn, text, entry)
    except Exception:  # noqa: BLE001 - hostile text must never crash a validator
        return 0.0


def _clamped(value) -> float:
    try:
        value = float(value)
    except (TypeError, ValueError):
        return 0.0
    return min(1.0, max(0.0, value)) if math.isfinite(value) else 0.0
