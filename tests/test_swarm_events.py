"""What a person sees from `swarm peer start`: role milestones in words, piece progress only when it says something."""

from __future__ import annotations

import io
import json
import re

from swarm.event_types import Gate, Generated, PeerDropped, Published, TrainStep, TransferProgress, Validated
from swarm.events import PROGRESS_HEARTBEAT_S, EventSink


def _lines(out: io.StringIO) -> list[str]:
    """The text lines without the time each starts with (swarm.log_lines, tested there)."""
    return [re.sub(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ ", "", line) for line in out.getvalue().splitlines()]


def progress(sink: EventSink, t: float, pieces: int, up: float = 0.0, peers: int = 3) -> None:
    sink.emit(TransferProgress(version=1, pieces=pieces, total=4, up_mib_s=up, down_mib_s=0.0, peers=peers), t=t)


def test_idle_progress_is_not_repeated_every_status_period_but_changes_and_transfers_are_shown():
    out = io.StringIO()
    sink = EventSink(stream=out)
    progress(sink, 0.0, 4)
    progress(sink, 2.0, 4)  # nothing changed, nothing moving: not repeated
    progress(sink, 4.0, 4, up=1.5)  # serving others: shown
    progress(sink, 6.0, 4, peers=4)  # a new peer: shown
    progress(sink, 8.0, 4, peers=4)
    progress(sink, 6.0 + PROGRESS_HEARTBEAT_S, 4, peers=4)  # a heartbeat after a quiet minute
    lines = _lines(out)
    assert len(lines) == 4, lines
    assert lines[0] == "policy v1: 4/4 pieces (100%), up 0.0 MiB/s, down 0.0 MiB/s, 3 peers"
    assert "up 1.5 MiB/s" in lines[1] and "4 peers" in lines[2]
    progress(sink, 200.0, 4, peers=1)
    assert _lines(out)[-1].endswith(", 1 peer")


def test_json_lines_keep_every_progress_event():
    out = io.StringIO()
    sink = EventSink(json_lines=True, stream=out)
    for t in (0.0, 2.0, 4.0):
        progress(sink, t, 4)
    assert [json.loads(line)["event"] for line in out.getvalue().splitlines()] == ["progress"] * 3


def test_role_milestones_are_sentences_in_text_mode():
    out = io.StringIO()
    sink = EventSink(stream=out)
    sink.emit(Published(version=3, bytes=2**20, validators=2, stage="short@4"))
    sink.emit(Published(version=4, bytes=2**20, id="ab"))  # `swarm publish`: a checkpoint, no run spec
    sink.emit(TrainStep(step=2, reward=0.25, groups=4, refused=0, stage="short@4", trained_groups=3,
                        lags={1: 4}, mean_tokens=4.0, hit_length=60, completions=64, sample="42"))
    sink.emit(TrainStep(step=3, reward=None, groups=0, refused=5, stage="short@4"))
    sink.emit(Generated(version=3, groups=4, mean_reward=0.5))
    sink.emit(Validated(checked=8, accepted=7, rejected=1))
    sink.emit(PeerDropped(version=3, dropped="12D3KooWx", reason="sent a corrupt piece 7", banned=True))
    sink.emit(Gate(waiting=1, ready=2, counts={}))  # bookkeeping for programs only
    assert _lines(out) == [
        "published policy v3 (1.00 MiB, 2 validators, stage short@4)",
        "published policy v4 (1.00 MiB)",
        "step 2: reward 0.250 on 4 quorum-accepted groups (3 with a learning signal, lags: 4 at lag 1, 4.0 "
        'tokens/completion, 60/64 cut at the limit; stage short@4) best: "42"',
        "step 3: no group inside the async window (5 refused, stage short@4)",
        "generated 4 groups with v3 (claimed mean reward 0.5)",
        "validated 8 rollouts so far: 7 accepted, 1 rejected",
        "dropped peer 12D3KooWx from policy v3: sent a corrupt piece 7; it is not linked again",
    ]


def test_an_event_whose_line_cannot_format_its_figures_is_printed_raw_and_the_emitter_goes_on():
    out = io.StringIO()
    EventSink(stream=out).emit(TrainStep(step=2, reward="high", stage="s"))  # type: ignore[arg-type]
    assert _lines(out)[0].startswith('train_step: {"step": 2, "reward": "high", "stage": "s", "version": 0')


def test_json_lines_name_the_kind_and_each_field_in_order_and_leave_out_the_absent_optional_ones():
    out = io.StringIO()
    sink = EventSink(json_lines=True, stream=out, peer="trainer")
    sink.emit(Published(version=3, id="ab", bytes=2**20, validators=2, stage="short@4"), t=1.5)
    sink.emit(Published(version=4, id="cd", bytes=2**20, trainer_key="ef"), t=2.0)
    assert out.getvalue().splitlines() == [
        '{"event": "published", "t": 1.5, "version": 3, "id": "ab", "bytes": 1048576, "validators": 2, '
        '"stage": "short@4", "peer": "trainer"}',
        '{"event": "published", "t": 2.0, "version": 4, "id": "cd", "bytes": 1048576, "trainer_key": "ef", '
        '"peer": "trainer"}']


def test_listeners_receive_the_typed_event_with_its_time_and_peer():
    heard = []
    sink = EventSink(stream=io.StringIO(), peer="validator0")
    sink.listeners.append(heard.append)
    sink.emit(Validated(checked=1, accepted=1), t=3.0)
    assert [(e.event, e.t, e.peer) for e in heard] == [(Validated(checked=1, accepted=1), 3.0, "validator0")]


def test_every_event_type_names_a_kind_of_its_own():
    import swarm.event_types as types

    kinds = [getattr(types, name).kind for name in types.__all__ if name != "Event"]
    assert all(kinds) and len(set(kinds)) == len(kinds)
