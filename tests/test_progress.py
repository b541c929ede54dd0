"""Progress bars: drawn on a terminal, absent from pipes and --json, and no library's own bar in a command's output."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys

import pytest
from rich.console import Console

from swarm.event_types import Adopted, Complete, Dropped, Event, TransferProgress
from swarm.progress import bar_console, progress_bars

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_bars_are_drawn_on_a_terminal_and_nowhere_else():
    terminal = Console(file=io.StringIO(), force_terminal=True, width=100)
    assert bar_console(console=terminal) is terminal
    assert bar_console(json_output=True, console=terminal) is None  # --json: a program reads the output
    assert bar_console(console=Console(file=io.StringIO(), force_terminal=False)) is None
    with progress_bars(terminal) as bars:
        steps, prompts = bars.bar("model tiny"), bars.bar("scoring", total=None)
        steps.step("loading the model")
        prompts.update(3, 8)
    drawn = terminal.file.getvalue()
    assert "model tiny" in drawn and "1/1" in drawn and "scoring" in drawn and "8/8" in drawn
    with progress_bars(None) as bars:  # off: the same calls, nothing drawn, nothing raised
        bars.bar("x").step("y")
        bars.bar("z", 4).update(1)


def run_eval(tmp_path, *flags: str, terminal: bool) -> subprocess.CompletedProcess:
    """`swarm eval` of a tiny model built into a fresh cache (building it saves weights with transformers, whose
    own bar would show there); TTY_COMPATIBLE=1 is rich's switch for a terminal it cannot detect."""
    env = {**os.environ, "SWARM_MODEL_CACHE": str(tmp_path / "cache"), "COLUMNS": "120"}
    env.pop("HF_HUB_DISABLE_PROGRESS_BARS", None)
    if terminal:
        env["TTY_COMPATIBLE"] = "1"
    return subprocess.run([sys.executable, "-m", "swarm", "eval", "--model", "tiny", "--task", "gcd", "--n", "8",
                           "--batch", "4", "--max-new-tokens", "2", *flags],
                          capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path)


@pytest.mark.timeout(330)
def test_eval_shows_its_bars_on_a_terminal(tmp_path):
    result = run_eval(tmp_path, terminal=True)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "model tiny: loading the model" in result.stderr and "scoring held-out prompts of gcd" in result.stderr
    assert "8/8" in result.stderr  # the scoring bar reached its end
    assert result.stdout.startswith("accuracy ")  # stdout keeps the result alone
    assert "Writing model shards" not in result.stderr and "it/s" not in result.stderr  # no transformers bar


def test_eval_through_a_pipe_with_json_prints_its_result_and_no_bar(tmp_path, monkeypatch, capfd):
    """In-process (the command as `swarm` runs it, minus a second interpreter's start): stdout and stderr are
    captured files here, not a terminal."""
    from swarm.cli.main import main

    monkeypatch.setenv("SWARM_MODEL_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("HF_HUB_DISABLE_PROGRESS_BARS", raising=False)  # put back as it was after the test
    status = main(["eval", "--model", "tiny", "--task", "gcd", "--n", "8", "--batch", "4", "--max-new-tokens", "2",
                   "--json"])
    out, err = capfd.readouterr()
    assert status == 0 and json.loads(out)["n"] == 8
    assert "scoring" not in err and "\r" not in err and "\x1b[" not in err
    assert "Writing model shards" not in err and "it/s" not in err  # no transformers bar


def download_events(version: int = 3) -> list[tuple[Event, float]]:
    return [(Adopted(version=version, id="ab", bytes=2**22, pieces=4), 0.0),
            (TransferProgress(version=version, pieces=1, total=4, up_mib_s=0.0, down_mib_s=2.5, peers=2), 1.0),
            (TransferProgress(version=version, pieces=4, total=4, up_mib_s=0.0, down_mib_s=1.0, peers=2), 2.0),
            (Complete(version=version, id="ab"), 2.5)]


def test_a_peers_download_is_a_bar_on_a_terminal_in_place_of_its_progress_lines():
    from swarm.events import EventSink
    from swarm.progress import DownloadBars

    terminal = Console(file=io.StringIO(), force_terminal=True, width=100)
    bars = DownloadBars(bar_console(console=terminal))
    lines = io.StringIO()
    sink = EventSink(stream=lines, hidden=bars.drawn_kinds)
    sink.listeners.append(bars.on_event)
    for event, t in download_events():
        sink.emit(event, t=t)
    sink.emit(Dropped(version=3))
    bars.close()
    drawn = terminal.file.getvalue()
    assert "policy v3 (2 peers, 2.5 MiB/s down)" in drawn and "4/4" in drawn and "policy v3 complete" in drawn
    assert not bars.bars  # the dropped version's bar is gone
    text = lines.getvalue()
    assert "announced" in text and "complete and verified" in text and "pieces (" not in text  # no progress lines


def test_without_a_terminal_a_peer_prints_its_progress_lines_and_draws_nothing():
    from swarm.events import EventSink
    from swarm.progress import DownloadBars

    bars = DownloadBars(bar_console(console=Console(file=io.StringIO(), force_terminal=False)))
    lines = io.StringIO()
    sink = EventSink(stream=lines, hidden=bars.drawn_kinds)
    sink.listeners.append(bars.on_event)
    for event, t in download_events():
        sink.emit(event, t=t)
    bars.close()
    assert bars.progress is None and "policy v3: 4/4 pieces (100%)" in lines.getvalue()
