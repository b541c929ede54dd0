"""The base of every event a peer emits (swarm.events.EventSink): a frozen dataclass whose class names its kind.

Why types: the status view, the metrics, the simulation and the heartbeats' progress read an event's figures by
attribute, so a renamed field is an error where it is read, not a missing key at run time. The JSON line keeps the
kind under "event" and each field under its own name, in declaration order, so programs reading the lines see
the same records. A field declared with `optional()` leaves the line when it is None: those are the figures some
emitters of a kind have and others lack (a `swarm publish` checkpoint names no validators).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, ClassVar

_OMIT_IF_NONE = {"omit_if_none": True}


def optional() -> Any:
    """A field that defaults to None and leaves the JSON line while it is None."""
    return dataclasses.field(default=None, metadata=_OMIT_IF_NONE)


@dataclass(frozen=True, kw_only=True)
class Event:
    """One thing a peer did or saw; subclasses set `kind`, the name its JSON line carries under "event".

    Fields are keyword-only, so a field's place in the class is its place in the JSON line and nothing else."""

    kind: ClassVar[str] = ""

    def fields(self) -> dict[str, object]:
        """The JSON line's fields after "event" and "t", in declaration order."""
        out: dict[str, object] = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if value is None and f.metadata.get("omit_if_none"):
                continue
            out[f.name] = value
        return out

    def line(self) -> str | None:
        """One line for a person, or None for events that are only for programs; by default the message."""
        message = getattr(self, "message", None)
        return f"{self.kind}: {message}" if message else None

