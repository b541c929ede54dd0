"""The whole swarm in one process: trainer, inference and validator peers, all real libp2p hosts.

The mission end to end (a cheating worker voted down while the trainer steps only on quorum-accepted groups) runs
once, through `swarm sim`, in tests/test_sim_report.py, which also checks the report drawn from it.
"""

from __future__ import annotations

import io

import pytest
import trio

from swarm.event_types import Published, PublishingEarly, TrainStep
from swarm.events import Emitted, EventSink
from swarm.sim.run import SimSettings, run_sim, summarize


@pytest.mark.timeout(200)
@pytest.mark.parametrize("async_level", [1, 0])
def test_one_worker_whose_answers_do_not_fill_a_batch_keeps_the_trainer_stepping(tmp_path, async_level):
    """One worker answers 2 prompts per version, a step wants 4: once it answered a version in full, the trainer
    sends the same weights out again at once and fills the batch from the next version (async), or trains on the
    two it holds at once (synchronous), never 30 s of quiet before every step; and a batch that a vote has just
    completed is trained on, not answered by yet another publish."""
    settings = SimSettings(out=tmp_path, inference=1, validators=1, seeds=0, prompts_per_worker=2,
                           prompts_per_step=4, steps=3, async_level=async_level, group_size=4, timeout_s=150.0,
                           watch_s=20.0)
    events: list[Emitted] = []
    sink = EventSink(json_lines=True, stream=io.StringIO())
    sink.listeners.append(events.append)
    report = summarize(events, trio.run(run_sim, settings, sink))
    assert not report["timed_out"] and report["steps"] == 3
    steps = [e for e in events if isinstance(e.event, TrainStep)]
    early = [e.event for e in events if isinstance(e.event, PublishingEarly)]
    if async_level:
        assert all(e.event.groups == 4 for e in steps)  # full batches from two versions of the same weights
        assert 3 <= len(early) <= 6 and all("every inference peer sent its 2 groups" in e.message for e in early)
    else:
        assert all(e.event.groups == 2 for e in steps) and not early  # trained at once on what it held
    first, last = min(e.t for e in steps), max(e.t for e in steps)
    assert last - first < 30  # no step waited out the 30 s of quiet
    published = sorted(e.event.version for e in events if isinstance(e.event, Published))
    kept = sorted(int(d.name[1:]) for d in (tmp_path / "trainer" / "swarm-policies").glob("v*"))
    assert len(published) > 3 and kept == published[-3:]  # the mirror's window; older copies deleted
