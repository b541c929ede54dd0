"""Rewards of completions, shared by inference (claimed rewards) and validators (recomputed rewards): where each
reward function of verify/reward_fns.py runs, and what a failure costs.

"exact" and "numeric" (pure Python, bounded work) run in the caller's process; "math", "rg:*" and a run's own
reward (module:function, verify/reward_loading.py) run in one scorer process (verify/scorer_worker.py) under a
deadline. Whatever happens (an unknown function, a scorer that raises, hangs or dies, a non-finite score), a
completion scores a float in [0, 1] and nothing raises.
"""

from __future__ import annotations

import math
import os
import pickle
import select
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path

from verify.reward_fns import REGISTRY, score_direct
from verify.reward_loading import is_custom_reward
from verify.scorer_worker import ForkedScorer, fork_is_safe

_SCORER_TIMEOUT_S = 5.0
_SCORER_START_S = 120.0


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


# Pure-Python scorers with bounded work (inputs capped at 256 characters) run in the caller's process.
_IN_PROCESS = frozenset({"exact", "numeric"})


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
        elif _out_of_process(reward_fn) and valid:
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


def _out_of_process(reward_fn: str) -> bool:
    """Whether a reward runs in the scorer process: math, reasoning-gym and a run's own reward, whose work on a
    hostile completion nothing here bounds."""
    return reward_fn in REGISTRY or reward_fn.startswith("rg:") or is_custom_reward(reward_fn)


def _direct_or_zero(reward_fn: str, text: str, entry: dict) -> float:
    try:
        return score_direct(reward_fn, text, entry)
    except Exception:  # noqa: BLE001 - hostile text must never crash a validator
        return 0.0


def _clamped(value) -> float:
    try:
        value = float(value)
    except (TypeError, ValueError):
        return 0.0
    return min(1.0, max(0.0, value)) if math.isfinite(value) else 0.0
