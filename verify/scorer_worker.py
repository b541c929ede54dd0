"""The reward scorer process: `python -m verify.scorer_worker`, driven by verify.rewards over stdin/stdout.

Why a plain subprocess rather than multiprocessing: spawn and forkserver re-import the parent's __main__ module,
which breaks (or re-runs) scripts without a main guard and stdin-fed programs; this child imports only what it
needs. Where a fork is safe (ForkedScorer) the same loop runs in a fork of the caller instead, which has its
imports already. Frames: parent -> child a 4-byte big-endian length then a pickle of a list of jobs, each
(reward_fn, [completion, ...], entry), built by the parent from its own data; child -> parent one 8-byte big-endian
double per completion of every job, in order. The child writes one ready byte first.
"""

from __future__ import annotations

import os
import pickle
import signal
import struct
import sys
import threading

from verify.reward_fns import score_direct


def _read_exact(stream, n: int) -> bytes | None:
    data = b""
    while len(data) < n:
        chunk = stream.read(n - len(data))
        if not chunk:
            return None
        data += chunk
    return data


def main(inp=None, out=None) -> None:
    """Serve frames from `inp` to `out` (default: this process's stdin and stdout) until the input ends."""
    import math_verify  # noqa: F401 - imported before signalling ready, so no request pays for it
    import reasoning_gym  # noqa: F401

    score_direct("math", "\\boxed{1}", {"answer": "1"})  # warm math-verify's lazy grammar up before ready
    inp = inp or sys.stdin.buffer
    out = out or sys.stdout.buffer
    out.write(b"R")
    out.flush()
    while True:
        header = _read_exact(inp, 4)
        if header is None:
            return
        body = _read_exact(inp, struct.unpack(">I", header)[0])
        if body is None:
            return
        try:
            jobs = [(str(fn), list(completions), entry) for fn, completions, entry in pickle.loads(body)]
        except Exception:  # noqa: BLE001 - cannot happen with our own parent; end rather than guess a count
            return
        out.write(b"".join(struct.pack(">d", _score_one(score_direct, fn, c, entry))
                           for fn, completions, entry in jobs for c in completions))
        out.flush()


def _score_one(score, reward_fn: str, completion: str, entry: dict) -> float:
    try:
        return float(score(reward_fn, completion, entry))
    except Exception:  # noqa: BLE001 - any scorer failure is a wrong answer
        return 0.0


def fork_is_safe() -> bool:
    """Whether this process may fork its scorer: Linux, no other Python thread (a fork copies only the calling
    thread, so a lock another thread held stays locked in the child) and no CUDA context."""
    if not sys.platform.startswith("linux"):
        return False
    torch = sys.modules.get("torch")
    return threading.active_count() == 1 and not (torch is not None and torch.cuda.is_initialized())


class ForkedScorer:
    """A scorer forked from the calling process, with the few Popen methods verify.rewards uses.

    Why: a scorer started as `python -m verify.scorer_worker` spends about 2 s importing reasoning-gym before it
    can answer, which sits on the critical path of every process that scores (the local generator's first batch
    waits for it). A fork of a process that has already imported it (the trainer and its generator build their
    task sets with it) is ready in about 0.2 s. The child keeps only its two pipe ends and never returns into the
    caller's code: it leaves through os._exit.
    """

    def __init__(self) -> None:
        request_r, request_w = os.pipe()
        reply_r, reply_w = os.pipe()
        for stream in (sys.stdout, sys.stderr):
            stream.flush()  # nothing buffered here may be written twice, once by the child
        pid = os.fork()
        if pid == 0:  # the child
            code = 1
            try:
                _detach_stdio()  # a scorer's stray print must never reach the caller's output
                _close_fds_except(request_r, reply_w)
                main(os.fdopen(request_r, "rb"), os.fdopen(reply_w, "wb"))
                code = 0
            finally:
                os._exit(code)
        os.close(request_r)
        os.close(reply_w)
        self.pid = pid
        self.stdin = os.fdopen(request_w, "wb")
        self.stdout = os.fdopen(reply_r, "rb")
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def kill(self) -> None:
        if self.poll() is None:
            try:
                os.kill(self.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def wait(self) -> int:
        if self.returncode is None:
            self.returncode = os.waitstatus_to_exitcode(os.waitpid(self.pid, 0)[1])
        return self.returncode


def _detach_stdio() -> None:
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)
    os.close(devnull)


def _close_fds_except(*keep: int) -> None:
    """Close every inherited descriptor but stdio and `keep`: the child must not hold the caller's pipes and
    sockets open (a peer would wait for an end of file that never comes)."""
    top = os.sysconf("SC_OPEN_MAX") if hasattr(os, "sysconf") else 4096
    low = 3
    for fd in sorted(keep):
        os.closerange(low, fd)
        low = fd + 1
    os.closerange(low, top)


if __name__ == "__main__":
    main()
