"""What happened in a `swarm sim` run, in time: the part of report.json that report.html draws.

Why from the events: every peer of the simulation already says what it did (a trainer step with its gate counts,
a held-out evaluation, a policy copy completed or garbage-collected, a worker banned), each stamped with one
monotonic clock, so the story is read back from them and no peer needs a hook for the report. Times are seconds
since the simulation's first event.
"""

from __future__ import annotations

from swarm.event_types import Complete, Dropped, Evaluated, Listening, TrainStep, WorkerBanned
from swarm.events import Emitted


def timeline(events: list[Emitted]) -> dict:
    """Steps (reward, groups the gate accepted and rejected since the step before), held-out evaluations, when
    each peer held each policy version, and every ban (who, by whom, when, why)."""
    if not events:
        return {"ended_s": 0.0, "steps": [], "heldout": [], "version_spread": {}, "bans": []}
    start = min(e.t for e in events)
    names = {e.event.peer_id: e.peer for e in events if isinstance(e.event, Listening)}
    return {
        "ended_s": _since(start, max(e.t for e in events)),
        "steps": _steps(events, start),
        "heldout": [{"when": e.event.when, "step": e.event.step, "accuracy": e.event.accuracy,
                     "at_s": _since(start, e.t)} for e in events if isinstance(e.event, Evaluated)],
        "version_spread": _spread(events, start),
        "bans": _bans(events, start, names),
    }


def _since(start: float, t: float) -> float:
    return round(t - start, 2)


def _steps(events: list[Emitted], start: float) -> list[dict]:
    """One row per trainer step; accepted and rejected are the gate's settlements since the step before (its
    counts are running totals)."""
    rows, before = [], {}
    for e in events:
        if not isinstance(e.event, TrainStep):
            continue
        gate = e.event.gate
        rows.append({"step": e.event.step, "at_s": _since(start, e.t), "reward": e.event.reward,
                     "groups": e.event.groups,
                     "accepted": gate.get("accepted", 0) - before.get("accepted", 0),
                     "rejected": gate.get("rejected", 0) - before.get("rejected", 0)})
        before = gate
    return rows


def _spread(events: list[Emitted], start: float) -> dict[str, dict[str, list]]:
    """Version -> peer -> [held from, held until] in seconds; until is None while the peer still held it at the
    end. A peer holds a version from its copy's completion (the trainer: its own publication) to its drop."""
    spread: dict[str, dict[str, list]] = {}
    for e in events:
        if not isinstance(e.event, (Complete, Dropped)):
            continue
        held = spread.setdefault(str(e.event.version), {})
        peer = e.peer or "?"
        if isinstance(e.event, Complete) and peer not in held:
            held[peer] = [_since(start, e.t), None]
        elif isinstance(e.event, Dropped) and peer in held and held[peer][1] is None:
            held[peer][1] = _since(start, e.t)
    return dict(sorted(spread.items(), key=lambda kv: int(kv[0])))


def _bans(events: list[Emitted], start: float, names: dict[str, str | None]) -> list[dict]:
    """Every worker_banned event: the trainer's (reputation, near-ties) and each validator's (near-ties)."""
    return [{"worker": e.event.worker, "peer": names.get(e.event.worker), "by": e.event.by or "near_ties",
             "reported_by": e.peer, "reason": e.event.reason, "at_s": _since(start, e.t)}
            for e in events if isinstance(e.event, WorkerBanned)]
