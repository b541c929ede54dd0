"""What a running peer tells its user: progress text for people, JSON lines for programs.

Why one sink: the benchmark and the tests read the same events a person sees, so what is measured is what runs.
Each JSON line carries `t`, a monotonic timestamp comparable across processes on one machine. Events are typed
(swarm.event_types); listeners in the process receive them as `Emitted`, programs outside read the JSON lines.
"""

from __future__ import annotations

import json
import logging
import math
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TextIO

from swarm.event_types import Dropped, Event, TransferProgress
from swarm.log_lines import install_log_handler, installed_format, prefixed

log = logging.getLogger(__name__)

PROGRESS_HEARTBEAT_S = 60.0
"""An idle policy's progress line (nothing moving, nothing changed) is repeated at most this often in text mode."""


@dataclass(frozen=True)
class Emitted:
    """An event as a sink sent it out: when, and which simulated peer said it (swarm.sim.run names each peer)."""

    event: Event
    t: float  # time.monotonic() when it was emitted
    peer: str | None = None  # the simulated peer's name; None outside a simulation

    def record(self) -> dict:
        """The JSON line's fields: "event", "t", the event's own, and "peer" when a simulated peer said it."""
        record = {"event": self.event.kind, "t": self.t, **self.event.fields()}
        if self.peer is not None:
            record["peer"] = self.peer
        return record


Listener = Callable[[Emitted], None]


class EventSink:
    """Emits events as JSON lines (`json_lines=True`) or as short human-readable lines.

    JSON lines carry every event; the text form says what a person needs: role milestones (steps, versions,
    rollouts, votes) and piece progress when it changes or moves, not the same idle line every status period.
    """

    def __init__(self, json_lines: bool = False, stream: TextIO | None = None,
                 hidden: frozenset[type[Event]] = frozenset(), peer: str | None = None) -> None:
        """hidden: kinds whose text line is not printed, because something else shows them (swarm.progress's
        download bars); JSON lines always carry every event. peer: the simulated peer this sink speaks for."""
        self.json_lines = json_lines
        self.stream = stream or sys.stdout
        self.hidden = hidden
        self.peer = peer
        self.listeners: list[Listener] = []
        self._last_progress: dict[int, tuple[int, int, float]] = {}  # version -> (pieces, peers, printed at)

    def configure_logging(self) -> None:
        """Log lines to stderr through swarm.log_lines' one handler (the command line's, when it installed one)."""
        if installed_format() is None:
            install_log_handler()
        # py-libp2p logs every unanswered DHT query and refused dial at WARNING or above; our own layers report
        # what a user can act on, so its chatter is kept for debugging only. Its import resets its logger to
        # WARNING (with no handler, so Python's last-resort handler printed bare lines), hence import it first.
        try:
            import libp2p  # noqa: F401
        except ImportError:
            pass
        for noisy in ("libp2p", "multiaddr"):
            logging.getLogger(noisy).setLevel(logging.CRITICAL)

    def emit(self, event: Event, t: float | None = None) -> None:
        """Send `event` to the listeners and out; `t` defaults to now (time.monotonic())."""
        emitted = Emitted(event, time.monotonic() if t is None else t, self.peer)
        for listener in self.listeners:
            listener(emitted)
        if isinstance(event, Dropped):  # a version that left the window never reports progress again
            self._last_progress.pop(event.version, None)
        if self.json_lines:
            print(json_line(emitted.record()), file=self.stream, flush=True)
        elif type(event) not in self.hidden and (not isinstance(event, TransferProgress)
                                                 or self._progress_worth_printing(event, emitted.t)):
            text = _describe_safely(emitted)
            if text:
                print(prefixed(text), file=self.stream, flush=True)

    def _progress_worth_printing(self, p: TransferProgress, t: float) -> bool:
        """A progress line when pieces or peers changed, bytes are moving, or a heartbeat is due."""
        previous = self._last_progress.get(p.version)
        moving = p.up_mib_s > 0 or p.down_mib_s > 0
        changed = previous is None or previous[:2] != (p.pieces, p.peers)
        if not (moving or changed or t - previous[2] >= PROGRESS_HEARTBEAT_S):
            return False
        self._last_progress[p.version] = (p.pieces, p.peers, t)
        return True


def _describe_safely(emitted: Emitted) -> str | None:
    """The event's line; an event whose figures its line cannot format is printed raw instead of ending the role
    that emitted it: a line is for a person, and a figure it cannot show must not end a command whose work is done."""
    try:
        return emitted.event.line()
    except (TypeError, ValueError) as exc:
        log.debug("no line for event %s: %r", emitted.event.kind, exc)
        fields = emitted.event.fields()
        return f"{emitted.event.kind}: {json.dumps(fields, default=_jsonable)}"


def json_line(record: dict) -> str:
    """The record as strict JSON: a number that is not finite (a NaN loss, an overflowing mean of claims a peer
    made) becomes null, since programs reading the events must always be able to parse them."""
    try:
        return json.dumps(record, default=_jsonable, allow_nan=False)
    except ValueError:
        return json.dumps(_finite(record), default=_jsonable, allow_nan=False)


def _finite(value: object) -> object:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


def _jsonable(value: object) -> str:
    if isinstance(value, bytes):
        return value.hex()
    return str(value)
