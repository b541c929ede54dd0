"""What a running peer tells its user: progress text for people, JSON lines for programs.

Why one sink: the benchmark and the tests read the same events a person sees, so what is measured is what runs.
Each JSON line carries `t`, a monotonic timestamp comparable across processes on one machine.
"""

from __future__ import annotations

import json
import logging
import math
import sys
import time

from swarm.log_lines import install_log_handler, installed_format, prefixed
from swarm.readable import readable_lags, readable_text

log = logging.getLogger(__name__)

PROGRESS_HEARTBEAT_S = 60.0
"""An idle policy's progress line (nothing moving, nothing changed) is repeated at most this often in text mode."""


class EventSink:
    """Emits events as JSON lines (`json_lines=True`) or as short human-readable lines.

    JSON lines carry every event; the text form says what a person needs: role milestones (steps, versions,
    rollouts, votes) and piece progress when it changes or moves, not the same idle line every status period.
    """

    def __init__(self, json_lines: bool = False, stream=None, hidden: frozenset[str] = frozenset()) -> None:
        """hidden: kinds whose text line is not printed, because something else shows them (swarm.progress's
        download bars); JSON lines always carry every event."""
        self.json_lines = json_lines
        self.stream = stream or sys.stdout
        self.hidden = hidden
        self.listeners: list = []
        self._last_progress: dict[object, tuple[int, int, float]] = {}  # version -> (pieces, peers, printed at)

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

    def emit(self, kind: str, info: dict | None = None, **fields) -> None:
        record = {"event": kind, "t": time.monotonic(), **(info or {}), **fields}
        for listener in self.listeners:
            listener(record)
        if kind == "dropped":  # a version that left the window never reports progress again
            self._last_progress.pop(record.get("version"), None)
        if self.json_lines:
            print(json_line(record), file=self.stream, flush=True)
        elif kind not in self.hidden and (kind != "progress" or self._progress_worth_printing(record)):
            text = _describe_safely(record)
            if text:
                print(prefixed(text), file=self.stream, flush=True)

    def _progress_worth_printing(self, r: dict) -> bool:
        """A progress line when pieces or peers changed, bytes are moving, or a heartbeat is due."""
        previous = self._last_progress.get(r["version"])
        moving = r["up_mib_s"] > 0 or r["down_mib_s"] > 0
        changed = previous is None or previous[:2] != (r["pieces"], r["peers"])
        if not (moving or changed or r["t"] - previous[2] >= PROGRESS_HEARTBEAT_S):
            return False
        self._last_progress[r["version"]] = (r["pieces"], r["peers"], r["t"])
        return True


def _describe_safely(r: dict) -> str | None:
    """The event's line; a record missing a field its line names is printed raw instead of ending the role that
    emitted it: a line is for a person, and a missing field must not end a command whose work is done."""
    try:
        return describe(r)
    except (KeyError, TypeError, ValueError) as exc:
        log.debug("no line for event %s: %r", r.get("event"), exc)
        fields = {k: v for k, v in r.items() if k not in ("event", "t")}
        return f"{r.get('event')}: {json.dumps(fields, default=_jsonable)}"


def json_line(record: dict) -> str:
    """The record as strict JSON: a number that is not finite (a NaN loss, an overflowing mean of claims a peer
    made) becomes null, since programs reading the events must always be able to parse them."""
    try:
        return json.dumps(record, default=_jsonable, allow_nan=False)
    except ValueError:
        return json.dumps(_finite(record), default=_jsonable, allow_nan=False)


def _finite(value):
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


def _jsonable(value):
    if isinstance(value, bytes):
        return value.hex()
    return str(value)


def describe(r: dict) -> str | None:
    """One line for a person about event `r`, or None for events that are only for programs."""
    kind = r["event"]
    if kind == "listening":
        addrs = "\n  ".join(r["addrs"])
        return f"peer {r['peer_id']} ({', '.join(r['roles'])}) listening on\n  {addrs}"
    if kind == "progress":
        pct = 100.0 * r["pieces"] / max(1, r["total"])
        return (f"policy v{r['version']}: {r['pieces']}/{r['total']} pieces ({pct:.0f}%), "
                f"up {r['up_mib_s']:.1f} MiB/s, down {r['down_mib_s']:.1f} MiB/s, "
                f"{r['peers']} peer{'' if r['peers'] == 1 else 's'}")
    if kind == "adopted":
        return f"policy v{r['version']} announced: {r['bytes'] / 2**20:.1f} MiB in {r['pieces']} pieces"
    if kind == "complete":
        return f"policy v{r['version']} complete and verified; seeding it"
    if kind == "refused":
        return f"warning: refused: {r.get('reason', '')}"
    if kind == "bootstrap_unreachable":  # the reason names the address
        return f"warning: bootstrap peer unreachable: {r.get('reason') or r.get('address', '')}"
    if kind == "dropped":
        return f"policy v{r['version']} left the window; garbage-collected"
    if kind in _WARNINGS:
        return f"{_WARNINGS[kind]}: {r['message']}"
    role_line = _ROLE_LINES.get(kind)
    if role_line is not None:
        return role_line(r)
    msg = r.get("message")
    return f"{kind}: {msg}" if msg else None


_WARNINGS = {"bootstrap_retry": "warning", "bootstrap_gave_up": "error", "trainer_key_gave_up": "error"}
"""Events whose message is a warning or the error that ends the peer (swarm.node.watchdogs)."""


def _patch_detail(r: dict) -> str:
    return f", as a {r['patch_bytes'] / 2**20:.2f} MiB patch" if r.get("patch_bytes") else ""


def _run_details(r: dict) -> str:
    """A trainer's version names its validators and curriculum stage; `swarm publish` of a checkpoint has neither."""
    details = [f"{r['validators']} validators" if "validators" in r else "",
               f"stage {r['stage']}" if "stage" in r else ""]
    return "".join(f", {d}" for d in details if d)


def _train_step_line(r: dict) -> str:
    if r.get("reward") is None:
        return f"step {r['step']}: no group inside the async window ({r['refused']} refused, stage {r['stage']})"
    return (f"step {r['step']}: reward {r['reward']:.3f} on {r['groups']} quorum-accepted groups "
            f"({r.get('trained_groups')} with a learning signal, lags: {readable_lags(r.get('lags'))}, "
            f"{r.get('mean_tokens')} tokens/completion, {r.get('hit_length')}/{r.get('completions')} cut at the "
            f"limit; stage {r['stage']}) "
            f"best: {readable_text(r.get('sample', ''))}")


_ROLE_LINES = {
    "published": lambda r: (f"published policy v{r['version']} ({r['bytes'] / 2**20:.2f} MiB"
                            f"{_patch_detail(r)}{_run_details(r)})"),
    "train_step": _train_step_line,
    "trainer_waiting": lambda r: (
        f"waiting {r['waited_s']} s for a batch: {r['ready']}/{r['wanted']} accepted groups "
        f"ready, {r['awaiting_votes']} awaiting votes, newest version v{r['newest_version']}"
    ),
    "trained": lambda r: f"training done: {r['steps']} steps, final policy v{r['version']} in {r['final']}",
    "generated": lambda r: (f"generated {r['groups']} groups with v{r['version']} (claimed mean reward "
                            f"{r['mean_reward']})"),
    "validated": lambda r: (f"validated {r.get('checked', 0)} rollouts so far: {r.get('accepted', 0)} accepted, "
                            f"{r.get('rejected', 0)} rejected"),
    "rejected_rollout": lambda r: f"voted to reject a rollout: {r['reason']}",
    "role_failed": lambda r: f"{r['role']} FAILED: {r['message']}",
    "peer_dropped": lambda r: (f"dropped peer {r['dropped']} from policy v{r['version']}: {r['reason']}"
                               + ("; it is not linked again" if r.get("banned") else "")),
    "dht_found": lambda r: f"found policy v{r['version']} through the DHT (gossip missed it)",
}
