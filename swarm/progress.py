"""Progress bars for the commands' long work (a model's conversion and loading, an evaluation, a download).

Why: converting, loading and evaluating a model take minutes (`swarm eval --model smollm2`: about 212 s on two
cores), and minutes of silence look the same as a hang. A bar says what is being done and how far it is. Bars are
drawn on stderr, and only when stderr is a terminal and the command was not asked for --json: a pipe, a log file or
a program reading JSON gets no escape codes and no carriage returns. The libraries' own tqdm bars (transformers
writes one when it saves or loads weights) are switched off for every command (`silence_library_bars`), so a
command's bars are its own.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from swarm.event_types import Adopted, Complete, Dropped, Event, TransferProgress
from swarm.events import Emitted


def silence_library_bars() -> None:
    """Turn off huggingface_hub's and transformers' tqdm bars (both read HF_HUB_DISABLE_PROGRESS_BARS when
    imported; transformers also keeps a switch of its own once imported). A user who set the variable keeps
    their choice."""
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    if os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] not in ("0", "false", "False") and "transformers" in sys.modules:
        from transformers.utils import logging as transformers_logging

        transformers_logging.disable_progress_bar()


def bar_console(json_output: bool = False, console: Console | None = None) -> Console | None:
    """The console to draw bars on (stderr unless `console` is given), or None when bars would only be noise:
    --json was asked for, or the console is not a terminal."""
    console = console or Console(stderr=True)
    return None if json_output or not console.is_terminal else console


class Bar:
    """One piece of work counted in units (`update(done, total)`) or in named steps (`step(name)`, each started
    step finishing the one before); without a console every call does nothing."""

    def __init__(self, progress: Progress | None, description: str, total: float | None) -> None:
        self.progress, self.description = progress, description
        self.task = progress.add_task(description, total=total) if progress is not None else None
        self.steps_started = 0

    def update(self, done: float, total: float | None = None) -> None:
        if self.progress is not None:
            self.progress.update(self.task, completed=done, total=total)

    def step(self, name: str) -> None:
        if self.progress is not None:
            self.progress.update(self.task, completed=self.steps_started, description=f"{self.description}: {name}")
        self.steps_started += 1

    def finish(self) -> None:
        if self.progress is not None:
            total = self.progress.tasks[self.task].total
            done = total if total is not None else self.steps_started
            self.progress.update(self.task, completed=done, total=done)


@contextlib.contextmanager
def progress_bars(console: Console | None) -> Iterator[BarMaker]:
    """Bars on `console` for the block (none when it is None); each bar the block makes is finished at its end."""
    if console is None:
        yield BarMaker(None)
        return
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=console, transient=False) as progress:
        maker = BarMaker(progress)
        yield maker
        for bar in maker.bars:
            bar.finish()


class BarMaker:
    def __init__(self, progress: Progress | None) -> None:
        self.progress = progress
        self.bars: list[Bar] = []

    def bar(self, description: str, total: float | None = None) -> Bar:
        self.bars.append(Bar(self.progress, description, total))
        return self.bars[-1]


class DownloadBars:
    """A peer's policy downloads as bars, one per version, driven by its events (an EventSink listener): a bar
    opens when a version is adopted, moves with each `progress` event (pieces verified, peers, download rate),
    ends when the copy is complete and goes when the version is dropped. Without a console it draws nothing and
    hides nothing. `drawn_kinds`: the events whose text lines the bars replace (swarm.events.EventSink.hidden)."""

    def __init__(self, console: Console | None) -> None:
        self.console = console
        self.drawn_kinds: frozenset[type[Event]] = frozenset({TransferProgress}) if console is not None else frozenset()
        self.progress: Progress | None = None
        self.bars: dict[int, int] = {}  # version -> its task in `progress`

    def on_event(self, emitted: Emitted) -> None:
        event = emitted.event
        if self.console is None or not isinstance(event, (Adopted, TransferProgress, Complete, Dropped)):
            return
        version = event.version
        if isinstance(event, (Adopted, TransferProgress)) and version not in self.bars:
            total = event.pieces if isinstance(event, Adopted) else event.total
            self.bars[version] = self._started().add_task(f"policy v{version}", total=total)
        if isinstance(event, TransferProgress) and version in self.bars:
            self.progress.update(self.bars[version], completed=event.pieces, total=event.total,
                                 description=f"policy v{version} ({event.peers} peers, "
                                             f"{event.down_mib_s:.1f} MiB/s down)")
        elif isinstance(event, Complete) and version in self.bars:
            total = self.progress.tasks[self.bars[version]].total
            self.progress.update(self.bars[version], completed=total, description=f"policy v{version} complete")
        elif isinstance(event, Dropped) and version in self.bars:
            self.progress.remove_task(self.bars.pop(version))
        if self.progress is not None:
            self.progress.refresh()  # each event drawn as it comes (a status period apart), not only the latest

    def _started(self) -> Progress:
        if self.progress is None:
            self.progress = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                     TextColumn("pieces"), TimeElapsedColumn(), console=self.console)
            self.progress.start()
        return self.progress

    def close(self) -> None:
        if self.progress is not None:
            self.progress.stop()
