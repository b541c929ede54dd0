"""Bounded shutdown: a peer (or a whole simulation) that has finished its work ends, even if closing does not.

Why: closing the network can hang with the trio loop idle and no worker thread alive, the work done and its
report not yet written: py-libp2p does some of its cleanup inside shielded cancel scopes, which no cancellation
reaches, and which close hangs is not known. So teardown gets three things: `TEARDOWN_GRACE_S` after which every
cancellable wait is cancelled (swarm.node.node), `report_stuck_tasks`, which logs where every task still waits halfway
through that grace, and, for the command-line entry points only, `ExitGuard`, a timer thread that ends the
process once the work is saved and the network has had `HARD_EXIT_AFTER_S` to close. Nothing is lost by it:
checkpoints and policy files are written by rename, and the operating system drops the data directory's flock with
the process. `Interrupts` gives every command the same end on Ctrl-C and SIGTERM (one line, status 130 or 143).
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
import threading
import warnings
from collections.abc import Callable, Coroutine
from types import FrameType
from typing import TYPE_CHECKING

import trio

if TYPE_CHECKING:
    from outcome import Outcome

TEARDOWN_GRACE_S = 20.0
HARD_EXIT_AFTER_S = 45.0
INTERRUPTED_EXIT_AFTER_S = 10.0
"""How long a command may unwind after SIGTERM before the process ends anyway (container runtimes send SIGKILL
about 10 s after SIGTERM; ending first lets the line saying so reach the log)."""
EXIT_STATUS = {signal.SIGINT: 130, signal.SIGTERM: 143}  # 128 + the signal number, the shell's convention


class ExitGuard:
    """Once armed, ends the process after `seconds` with the armed status unless disarmed first (the normal exit).

    before_exit: what the normal exit would still have done (the simulation's report)."""

    def __init__(self, seconds: float, before_exit: Callable[[], None] = lambda: None,
                 exit_process: Callable[[int], None] = os._exit, message: str | None = None) -> None:
        self.seconds, self.before_exit, self.exit_process = seconds, before_exit, exit_process
        self.message = message or (f"the network did not finish closing within {seconds:.0f} s of the end of the "
                                   f"work (a py-libp2p close that waits for ever); exiting anyway, nothing is lost")
        self.status = 0
        self._timer: threading.Timer | None = None
        self._lock = threading.Lock()  # the normal exit and the guard never both finish the work
        self._disarmed = False

    def arm(self, status: int = 0) -> None:
        if self._timer is None:
            self.status = status
            self._timer = threading.Timer(self.seconds, self.expire)
            self._timer.daemon = True
            self._timer.start()

    def disarm(self) -> None:
        """The normal exit got there first (blocks while an expiring guard ends the process)."""
        with self._lock:
            self._disarmed = True
            if self._timer is not None:
                self._timer.cancel()

    def quiet(self) -> None:
        """Keep the bound but end silently: the normal exit has said its line and only the interpreter's own
        teardown is left (blocks while an expiring guard ends the process)."""
        with self._lock:
            self.message = ""

    def expire(self) -> None:
        """Finish what the normal exit would have done, say why in one line, and end the process."""
        with self._lock:
            if not self._disarmed:
                self._finish()

    def _finish(self) -> None:
        try:
            self.before_exit()
        finally:
            if self.message:
                print(self.message, file=sys.stderr)
            sys.stdout.flush()
            sys.stderr.flush()
            self.exit_process(self.status)


class Interrupts:
    """Ctrl-C and SIGTERM end every command the same way: an orderly unwind, one line, status 130 or 143.

    Why SIGTERM is handed to the SIGINT handler: inside `trio.run` that handler is trio's, which raises
    KeyboardInterrupt only where it is safe (into the main task at its next checkpoint when the signal lands in
    trio's own code), so a SIGTERM unwinds every nursery and closes every file exactly as Ctrl-C does; outside trio
    it is Python's own. Files that must never be seen half-written (keys, checkpoints, policies, pieces) are
    written by rename, so an unwind at any point leaves each data directory consistent. A SIGTERM, or a Ctrl-C
    inside a command's trio run (run_trio), arms an ExitGuard: a close that waits in a shielded scope cannot hold
    the process past INTERRUPTED_EXIT_AFTER_S."""

    def __init__(self, grace_s: float = INTERRUPTED_EXIT_AFTER_S,
                 exit_process: Callable[[int], None] = os._exit) -> None:
        self.grace_s, self.exit_process = grace_s, exit_process
        self.received: int | None = None  # SIGTERM once one arrived (a SIGINT is seen as its KeyboardInterrupt)
        self.guard: ExitGuard | None = None

    @contextlib.contextmanager
    def installed(self):
        """Take SIGTERM for the block, unless the process chose what it does (ignored, or a handler of its own) or
        this is not the main thread (a test calling the CLI in-process); what was there is put back after."""
        if threading.current_thread() is not threading.main_thread() or \
                signal.getsignal(signal.SIGTERM) != signal.SIG_DFL:
            yield self
            return
        sigint_ignored = signal.getsignal(signal.SIGINT) == signal.SIG_IGN
        if sigint_ignored:  # a background job of a script (`nohup swarm ... &`) inherits SIGINT ignored; a peer
            # must still stop on `kill -INT`, and trio.run installs its own SIGINT handler (the only safe way to
            # interrupt it, on SIGTERM too) only over Python's default one
            signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.signal(signal.SIGTERM, self.on_terminate)
        # Ctrl-C is raised by trio's own handler, with nothing of ours between it and the unwind that may collect
        # a coroutine it cut off before its task started: the filter must already be in place.
        ignore_unstarted_coroutines()
        _INSTALLED.append(self)
        try:
            yield self
        finally:
            _INSTALLED.remove(self)
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            if sigint_ignored:
                signal.signal(signal.SIGINT, signal.SIG_IGN)

    def on_terminate(self, signum: int, frame: FrameType | None) -> None:
        if self.received is None:
            self.received = signal.SIGTERM
        self._bound_the_unwind()
        interrupt = signal.getsignal(signal.SIGINT)
        if not callable(interrupt):  # a handler of SIGINT set outside the CLI is gone: interrupt all the same
            raise KeyboardInterrupt
        interrupt(signal.SIGINT, frame)

    def _bound_the_unwind(self) -> None:
        """Arm the ExitGuard once, with the status and line of the first signal."""
        if self.guard is None:
            ignore_unstarted_coroutines()  # before the unwind, which may collect one
            self.guard = ExitGuard(self.grace_s, exit_process=self.exit_process,
                                   message=f"{self.line()} (still closing after {self.grace_s:.0f} s; exiting anyway)")
            self.guard.arm(self.status())

    def run_trio(self, async_fn: Callable, *args, **kwargs):
        """trio.run(async_fn, *args), with Ctrl-C bounded like SIGTERM: once trio has taken SIGINT (its handler is
        the only safe way into a trio run), a handler of ours arms the ExitGuard and hands the signal on to it. Why:
        a py-libp2p close that waits in a shielded scope held an interrupted peer for tens of seconds."""
        async def guarded():
            trio_handler = signal.getsignal(signal.SIGINT)
            if not callable(trio_handler) or threading.current_thread() is not threading.main_thread():
                return await async_fn(*args)

            def on_interrupt(signum: int, frame: FrameType | None) -> None:
                self._bound_the_unwind()
                trio_handler(signum, frame)

            signal.signal(signal.SIGINT, on_interrupt)
            try:
                return await async_fn(*args)
            finally:  # trio puts Python's handler back only if it finds its own in place
                if signal.getsignal(signal.SIGINT) is on_interrupt:
                    signal.signal(signal.SIGINT, trio_handler)

        return trio.run(guarded, **kwargs)

    def status(self) -> int:
        return EXIT_STATUS[self.received or signal.SIGINT]

    def line(self) -> str:
        return "swarm: terminated" if self.received == signal.SIGTERM else "swarm: interrupted"

    def finish(self) -> int:
        """Say in one line that the command was interrupted (unless the guard already ended the process); the
        guard still bounds the interpreter's teardown (torch's alone has taken 14-20 s on a busy machine)."""
        if self.guard is not None:
            self.guard.quiet()
        ignore_unstarted_coroutines()
        print(self.line(), file=sys.stderr)
        return self.status()


_INSTALLED: list[Interrupts] = []  # the Interrupts whose signals are in force (the command running, if any)


def run_trio(async_fn: Callable, *args, **kwargs):
    """A command's trio.run: with Ctrl-C bounded by the installed Interrupts (Interrupts.run_trio), plain where
    none is installed (a command's code called from a test or another thread)."""
    if _INSTALLED:
        return _INSTALLED[-1].run_trio(async_fn, *args, **kwargs)
    return trio.run(async_fn, *args, **kwargs)


def ignore_unstarted_coroutines() -> None:
    """An interrupt can land between a task's coroutine being made and its task being scheduled (trio's start_soon
    is not atomic against KeyboardInterrupt): that coroutine never runs, and Python would add a RuntimeWarning about
    it to the one line when it is collected, which can happen during the unwind itself."""
    warnings.filterwarnings("ignore", message=r"coroutine .* was never awaited", category=RuntimeWarning)


def is_interrupt(exc: BaseException) -> bool:
    """Whether `exc` is a KeyboardInterrupt, or an exception group (trio's nurseries wrap what they unwind) with
    one among its leaves; the other leaves are then what the interrupt cut short, not errors of their own."""
    if isinstance(exc, BaseExceptionGroup):
        return any(is_interrupt(inner) for inner in exc.exceptions)
    return isinstance(exc, KeyboardInterrupt)


async def report_stuck_tasks(after_s: float, closed: trio.Event, logger: logging.Logger) -> None:
    """Unless `closed` (a trio.Event) is set within `after_s`, log where every task still alive waits. Run as a
    trio system task once teardown starts, so it outlives a peer whose teardown it watches. Why: a hang this
    module bounds leaves no other trace of which close never finished."""
    with trio.move_on_after(after_s):
        await closed.wait()
        return
    lines = waiting_tasks()
    logger.warning("still closing the network after %.0f s; %d tasks wait: %s", after_s, len(lines),
                   "; ".join(lines[:40]))


def waiting_tasks() -> list[str]:
    """One line per task of this trio run that waits on something other than its own children: its name and
    where it waits (a task parked at the end of a nursery block only waits for the tasks listed beside it)."""
    out: list[str] = []
    pending = [trio.lowlevel.current_root_task()]
    while pending:
        task = pending.pop()
        pending.extend(c for n in task.child_nurseries for c in n.child_tasks)
        if task is trio.lowlevel.current_task():
            continue
        where = _innermost_frame(task.coro)
        if not where.endswith(" in _nested_child_finished"):
            out.append(f"{task.name} at {where}")
    return sorted(out, key=lambda line: ("site-packages" in line or "libp2p/" in line or "trio/" in line, line))


def _innermost_frame(coro: Coroutine[object, Outcome[object], object]) -> str:
    """Where a coroutine chain waits: its deepest frame outside trio and contextlib (the code that awaits), and
    the trio call it waits in."""
    frames = []
    obj = coro
    for _ in range(200):  # chains are short; bounded in case of a cycle
        frame = getattr(obj, "cr_frame", None) or getattr(obj, "ag_frame", None) or getattr(obj, "gi_frame", None)
        if frame is not None:
            frames.append(frame)
        obj = getattr(obj, "cr_await", None) or getattr(obj, "ag_await", None) or getattr(obj, "gi_yieldfrom", None)
        if obj is not None and not any(hasattr(obj, a) for a in ("cr_frame", "ag_frame", "gi_frame")) and frame:
            # an async generator's asend/athrow awaitable (an @asynccontextmanager's exit) hides its generator:
            # take it from the awaiting frame's context manager
            obj = getattr(frame.f_locals.get("self"), "gen", None)
        if obj is None:
            break
    if not frames:
        return "?"
    ours = [f for f in frames if not any(part in f.f_code.co_filename for part in _LIBRARY_FRAMES)] or frames
    where = ours[-1]
    text = f"{where.f_code.co_name} ({short_path(where.f_code.co_filename)}:{where.f_lineno})"
    return text if frames[-1] is where else f"{text} in {frames[-1].f_code.co_name}"


_LIBRARY_FRAMES = ("/trio/", "/contextlib.py", "/outcome/")


def short_path(path: str) -> str:
    """A path inside site-packages from there, one under the working directory relative to it."""
    if "site-packages/" in path:
        return path.rsplit("site-packages/", 1)[-1]
    cwd = os.getcwd().rstrip("/") + "/"
    return path[len(cwd):] if path.startswith(cwd) else path
