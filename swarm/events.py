"""What a running peer tells its user: progress text for people, JSON lines for programs.

Why one sink: the benchmark and the tests read the same events a person sees, so what is measured is what runs.
Each JSON line carries `t`, a monotonic timestamp comparable across processes on one machine.
"""

from __future__ import annotations

import json
import logging
import sys
import time


class EventSink:
    """Emits events as JSON lines (`json_lines=True`) or as short human-readable lines."""

    def __init__(self, json_lines: bool = False, stream=None) -> None:
        self.json_lines = json_lines
        self.stream = stream or sys.stdout
        self.listeners: list = []

    def configure_logging(self, level: int = logging.WARNING) -> None:
        logging.basicConfig(level=level, stream=sys.stderr, format="%(levelname)s %(name)s: %(message)s")
        # py-libp2p logs every unanswered DHT query and refused dial at WARNING or above; our own layers report
        # what a user can act on, so its chatter is kept for debugging only. Its import resets its logger to
        # WARNING (with no handler, so Python's last-resort handler printed bare lines), hence import it first.
        try:
            import libp2p  # noqa: F401
        except ImportError:
            pass
        for noisy in ("libp2p", "multiaddr"):
            logging.getLogger(noisy).setLevel(logging.CRITICAL)

    def emit(self, kind: str, info: dict | None = None, **fields) -> None:
        record = {"event": kind, "t": time.monotonic(), **(info or {}), **fields}
        for listener in self.listeners:
            listener(record)
        if self.json_lines:
            print(json.dumps(record, default=_jsonable), file=self.stream, flush=True)
        else:
            text = _human(record)
            if text:
                print(text, file=self.stream, flush=True)


def _jsonable(value):
    if isinstance(value, bytes):
        return value.hex()
    return str(value)


def _human(r: dict) -> str | None:
    kind = r["event"]
    if kind == "listening":
        addrs = "\n  ".join(r["addrs"])
        return f"peer {r['peer_id']} ({', '.join(r['roles'])}) listening on\n  {addrs}"
    if kind == "progress":
        pct = 100.0 * r["pieces"] / max(1, r["total"])
        return (f"policy v{r['version']}: {r['pieces']}/{r['total']} pieces ({pct:.0f}%), "
                f"up {r['up_mib_s']:.1f} MiB/s, down {r['down_mib_s']:.1f} MiB/s, {r['peers']} peers")
    if kind == "adopted":
        return f"policy v{r['version']} announced: {r['bytes'] / 2**20:.1f} MiB in {r['pieces']} pieces"
    if kind == "complete":
        return f"policy v{r['version']} complete and verified; seeding it"
    if kind in ("refused", "bootstrap_unreachable"):
        return f"warning: {kind.replace('_', ' ')}: {r.get('reason', '')} {r.get('address', '')}".rstrip()
    if kind == "dropped":
        return f"policy v{r['version']} left the window; garbage-collected"
    msg = r.get("message")
    return f"{kind}: {msg}" if msg else None
