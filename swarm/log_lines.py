"""Every line a command prints for a person starts with the UTC time and the name of who printed it.

Why: a run lasts days and several peers often write into one terminal or one file; a line without a time or a
name cannot be placed. Event lines (swarm.events) and log records (the `logging` module) share one prefix, and
`--log-format json` makes each log record one JSON object on stderr for programs. One handler, on the root logger,
prints every record once: it replaces any handler installed here before, so a command that configures logging
twice still prints each line once.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from typing import TextIO

LOG_FORMATS = ("text", "json")
_NAME = {"name": ""}  # the process's name on its lines: a peer's short id, once known


def set_line_name(name: str) -> None:
    """Name this process's lines (a peer's short id; empty: none)."""
    _NAME["name"] = name


def line_name() -> str:
    return _NAME["name"]


def short_peer_name(peer_id: str) -> str:
    """A peer id's last 8 characters: what sets peers apart (every id starts with the same 12D3KooW)."""
    return peer_id[-8:]


def stamp(when: float | None = None) -> str:
    """UTC time to the second, ISO 8601."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() if when is None else when))


def prefixed(text: str, when: float | None = None) -> str:
    """`text` after the time and this process's name."""
    name = line_name()
    return f"{stamp(when)} {name} {text}" if name else f"{stamp(when)} {text}"


class TextFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        line = prefixed(f"{record.levelname.lower()} {record.name}: {record.getMessage()}", record.created)
        return f"{line}\n{self.formatException(record.exc_info)}" if record.exc_info else line


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        fields = {"t": stamp(record.created), "peer": line_name(), "level": record.levelname.lower(),
                  "logger": record.name, "message": record.getMessage()}
        if record.exc_info:
            fields["traceback"] = self.formatException(record.exc_info)
        return json.dumps(fields)


class _StderrHandler(logging.StreamHandler):
    """Writes to whatever sys.stderr is when a record arrives (a test's capture, a redirected stream)."""

    def __init__(self) -> None:
        super().__init__()

    @property
    def stream(self):
        return sys.stderr

    @stream.setter
    def stream(self, value: TextIO) -> None:
        pass


def install_log_handler(log_format: str = "text") -> logging.Handler:
    """The root logger's one handler of ours, in `log_format`; one installed earlier is replaced."""
    root = logging.getLogger()
    for handler in list(root.handlers):
        if isinstance(handler, _StderrHandler):
            root.removeHandler(handler)
    handler = _StderrHandler()
    handler.setFormatter(JsonFormatter() if log_format == "json" else TextFormatter())
    root.addHandler(handler)
    return handler


def installed_format() -> str | None:
    """The format of the handler installed here, or None when there is none."""
    for handler in logging.getLogger().handlers:
        if isinstance(handler, _StderrHandler):
            return "json" if isinstance(handler.formatter, JsonFormatter) else "text"
    return None


def say(line: str, stream: TextIO | None = None) -> None:
    """Print a command's own line for a person (progress, results) with the same prefix as its log lines, or as
    one JSON object when the log format is json."""
    if installed_format() == "json":
        line = json.dumps({"t": stamp(), "peer": line_name(), "message": line})
    else:
        line = prefixed(line)
    print(line, file=stream or sys.stderr, flush=True)
