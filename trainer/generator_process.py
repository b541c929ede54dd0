"""The local rollout generator in its own OS process, as the swarm runs inference on separate peers.

Why a process and not a thread: on the tiny model generation is per-token Python (sampling, cache bookkeeping)
and it is the bottleneck; in a thread of the trainer's process it competes with training for the GIL, so async-2
did more training compute in the same wall time without finishing sooner. A separate process has its own
interpreter and its own torch thread count (`generator_threads`), so generation and training truly overlap.

The protocol is plain data over two multiprocessing queues. The process is forked from the trainer once its model
and task set are loaded (fork_is_safe says when and why), else spawned, when it loads its own:
  trainer -> generator  ("policy", PublishedPolicy)  the newest published version (its files on disk, as a
                                                     worker hot-swaps from a manifest)
                        ("generate", step)           produce the batch of this assignment step
                        ("stop", None)
  generator -> trainer  ("ready", None), ("batch", (step, [RolloutGroup, ...])), ("error", sentence)
The generator drains every pending message before each batch, so a batch always uses the newest policy it was
told of; the results queue is bounded (backpressure). The trainer owns the process: `GeneratorProcess` is a
context manager that stops, joins and if need be terminates and kills it, also on errors and Ctrl-C, and every
wait on it is bounded and checks that the process is alive, so a dead generator is one clear error, not a hang.
"""

from __future__ import annotations

import multiprocessing
import os
import queue
import sys
import time
from collections import deque

import torch

from inference.models import load_model
from trainer.config import TrainerConfig
from trainer.errors import GeneratorDied
from trainer.local_source import LocalRolloutSource
from trainer.session_setup import load_task_split, seed_everything
from verify.rewards import start_scorer

POLL_S = 0.2  # how often a waiting trainer checks that the generator is still alive
JOIN_S = 10.0  # how long a stopping generator may take before it is terminated, then killed


def build_local_source(cfg: TrainerConfig, preloaded=None):
    """The same LocalRolloutSource `swarm train` uses in-process: same model spec, task split, run and prompts.

    preloaded: (loaded model, train set) inherited by a forked generator (its own copy-on-write copies of the
    trainer's at the fork); else the task set is split and the model loaded here, as the trainer does."""
    seed_everything(cfg.seed)
    loaded, train_set = preloaded if preloaded is not None else (None, load_task_split(cfg)[0])
    start_scorer({entry.reward_fn for entry in train_set})  # now: its start overlaps the model load or the evaluation
    return LocalRolloutSource.from_loaded(cfg, loaded or load_model(cfg.model), train_set)


def generator_main(cfg: TrainerConfig, requests, results, preloaded=None) -> None:
    """Child entry point: build the source (from the trainer's model and task set when forked with them), then
    answer generate requests with the newest known policy."""
    code = 0
    try:
        if cfg.generator_own_session:
            os.setsid()
        torch.set_num_threads(cfg.generator_threads)
        source = build_local_source(cfg, preloaded)
        results.put(("ready", None))
        _serve(source, requests, results)
    except KeyboardInterrupt:  # Ctrl-C reaches the whole process group; the trainer reports it
        code = 130
    except Exception as exc:  # one sentence for the trainer; the process then exits
        sentence = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        results.put(("error", f"{type(exc).__name__}: {sentence}"))
        code = 1
    results.close()
    results.join_thread()  # everything put is delivered ...
    os._exit(code)  # ... then skip the interpreter's teardown, measured at 14-20 s with torch loaded on a busy box


def _next_message(requests, parent: int):
    """Block for the next message, but exit when the trainer is gone (killed, so it could not say stop)."""
    while True:
        try:
            return requests.get(timeout=POLL_S * 5)
        except queue.Empty:
            if os.getppid() != parent:
                return ("stop", None)


def _serve(source, requests, results) -> None:
    policy, pending, parent = None, deque(), os.getppid()
    while True:
        messages = [_next_message(requests, parent)] if not pending or policy is None else []
        while True:  # drain: a newer policy may have arrived behind the next request
            try:
                messages.append(requests.get_nowait())
            except queue.Empty:
                break
        for kind, body in messages:
            if kind == "stop":
                return
            if kind == "policy":
                policy = body
            else:
                pending.append(body)
        if pending and policy is not None:
            step = pending.popleft()
            results.put(("batch", (step, source.generate(step, policy))))


def fork_is_safe() -> bool:
    """Whether the generator may be forked from the trainer: Linux, and no CUDA context (which a fork corrupts).

    Why fork at all: a spawned generator re-imports torch and transformers, rebuilds the task set, loads its model
    and only then needs its reward scorer; on this 2-core box, next to a trainer doing the same, that takes 11 s, so
    async runs would start 3-4 s behind synchronous ones. Forked once the trainer has loaded, it inherits the imports,
    the task set and a copy-on-write copy of the initial model (its own from then on: the trainer's later steps
    never reach it), and starts its scorer at once, while the trainer evaluates. The trainer has started no thread
    of its own by then (trio runs later); verify.rewards makes a forked child start its own scorer rather than share
    the trainer's.
    """
    if not sys.platform.startswith("linux") or "fork" not in multiprocessing.get_all_start_methods():
        return False
    return not torch.cuda.is_initialized()


class GeneratorProcess:
    """Owns one generator process; `with GeneratorProcess(cfg) as gen:` starts it and always reaps it."""

    def __init__(self, cfg: TrainerConfig, *, max_batches: int = 1, preloaded=None) -> None:
        self.cfg = cfg
        self.start_method = "fork" if preloaded is not None and fork_is_safe() else "spawn"
        ctx = multiprocessing.get_context(self.start_method)
        self.requests = ctx.Queue()
        self.results = ctx.Queue(maxsize=max(1, max_batches))
        args = (cfg, self.requests, self.results, preloaded if self.start_method == "fork" else None)
        self.process = ctx.Process(target=generator_main, args=args, name="rollout-generator", daemon=True)
        self.ready = False
        self._sent_version: int | None = None
        self._last_requested: int | None = None

    def __enter__(self) -> "GeneratorProcess":
        self.process.start()
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        """Ask it to stop, then terminate and kill as needed; the process is always reaped."""
        if self.process.pid is None:
            return
        if self.process.is_alive():
            try:
                self.requests.put(("stop", None))
            except (OSError, ValueError):
                pass
            self._drain_results()  # a child blocked on a full results queue could not see the stop
            self.process.join(JOIN_S)
        for end in (self.process.terminate, self.process.kill):
            if self.process.is_alive():
                end()
                self.process.join(JOIN_S)
        for q in (self.requests, self.results):
            q.cancel_join_thread()  # never block the trainer's exit on undelivered queue data
            q.close()

    def _drain_results(self) -> None:
        try:
            while True:
                self.results.get_nowait()
        except (queue.Empty, OSError, ValueError):
            pass

    # --- the trainer's side of the protocol -------------------------------------------------------------------
    def publish(self, policy) -> None:
        """Tell the generator about a newer published version (no-op when it already knows this one)."""
        if policy.version != self._sent_version:
            self.requests.put(("policy", policy))
            self._sent_version = policy.version

    def request(self, step: int) -> None:
        """Ask for the batch of `step`. Steps are asked for in increasing order, so one already asked for (the
        trainer primes the generator before its first evaluation, then its loop asks again) is ignored."""
        if self._last_requested is None or step > self._last_requested:
            self._last_requested = step
            self.requests.put(("generate", step))

    def poll(self, timeout: float = POLL_S):
        """(step, groups) of the next batch, or None when none arrived within `timeout`; raises if it died."""
        try:
            kind, body = self.results.get(timeout=timeout)
        except queue.Empty:
            if not self.process.is_alive():
                raise GeneratorDied(f"the generator process exited with code {self.process.exitcode} "
                                    "before sending its batch") from None
            return None
        if kind == "error":
            raise GeneratorDied(f"the generator process failed: {body}")
        if kind == "ready":
            self.ready = True
            return self.poll(timeout)
        return body

    def receive(self, timeout: float | None = None):
        """Blocking (step, groups) within `timeout` seconds (default cfg.generator_timeout_s)."""
        limit = self.cfg.generator_timeout_s if timeout is None else timeout
        deadline = time.monotonic() + limit
        while (remaining := deadline - time.monotonic()) > 0:
            batch = self.poll(min(POLL_S, remaining))
            if batch is not None:
                return batch
        raise GeneratorDied(f"the generator process sent no batch within {limit:.0f} s")

    def generate(self, step: int, policy) -> list:
        """The RolloutSource interface (blocking), e.g. for a synchronous loop or a determinism check."""
        self.publish(policy)
        self.request(step)
        got, groups = self.receive()
        if got != step:
            raise GeneratorDied(f"the generator process answered step {got} when asked for step {step}")
        return groups
