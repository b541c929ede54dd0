"""What happened in a `swarm sim` run, in time: the part of report.json that report.html draws.

Why from the events: every peer of the simulation already says what it did (a trainer step with its gate counts,
a held-out evaluation, a policy copy completed or garbage-collected, a worker banned), each stamped with one
monotonic clock, so the story is read back from them and no peer needs a hook for the report. Times are seconds
since the simulation's first event.
"""

from __future__ import annotations


def timeline(events: list[dict]) -> dict:
    """Steps (reward, groups the gate accepted and rejected since the step before), held-out evaluations, when
    each peer held each policy version, and every ban (who, by whom, when, why)."""
    stamped = [e for e in events if isinstance(e.get("t"), (int, float))]
    if not stamped:
        return {"ended_s": 0.0, "steps": [], "heldout": [], "version_spread": {}, "bans": []}
    start = min(e["t"] for e in stamped)
    names = {e["peer_id"]: e.get("peer") for e in stamped if e["event"] == "listening" and "peer_id" in e}
    return {
        "ended_s": _since(start, max(e["t"] for e in stamped)),
        "steps": _steps(stamped, start),
        "heldout": [{"when": e.get("when"), "step": e.get("step"), "accuracy": e.get("accuracy"),
                     "at_s": _since(start, e["t"])} for e in stamped if e["event"] == "evaluated"],
        "version_spread": _spread(stamped, start),
        "bans": _bans(stamped, start, names),
    }


def _since(start: float, t: float) -> float:
    return round(t - start, 2)


def _steps(events: list[dict], start: float) -> list[dict]:
    """One row per trainer step; accepted and rejected are the gate's settlements since the step before (its
    counts are running totals)."""
    rows, before = [], {}
    for e in events:
        if e["event"] != "train_step":
            continue
        gate = e.get("gate") or {}
        rows.append({"step": e.get("step"), "at_s": _since(start, e["t"]), "reward": e.get("reward"),
                     "groups": e.get("groups"),
                     "accepted": gate.get("accepted", 0) - before.get("accepted", 0),
                     "rejected": gate.get("rejected", 0) - before.get("rejected", 0)})
        before = gate
    return rows


def _spread(events: list[dict], start: float) -> dict[str, dict[str, list]]:
    """Version -> peer -> [held from, held until] in seconds; until is None while the peer still held it at the
    end. A peer holds a version from its copy's completion (the trainer: its own publication) to its drop."""
    spread: dict[str, dict[str, list]] = {}
    for e in events:
        if e["event"] not in ("complete", "dropped") or not isinstance(e.get("version"), int):
            continue
        held = spread.setdefault(str(e["version"]), {})
        peer = str(e.get("peer", "?"))
        if e["event"] == "complete" and peer not in held:
            held[peer] = [_since(start, e["t"]), None]
        elif e["event"] == "dropped" and peer in held and held[peer][1] is None:
            held[peer][1] = _since(start, e["t"])
    return dict(sorted(spread.items(), key=lambda kv: int(kv[0])))


def _bans(events: list[dict], start: float, names: dict[str, str | None]) -> list[dict]:
    """Every worker_banned event: the trainer's (reputation, near-ties) and each validator's (near-ties)."""
    return [{"worker": e.get("worker"), "peer": names.get(e.get("worker")), "by": e.get("by", "near_ties"),
             "reported_by": e.get("peer"), "reason": e.get("reason"), "at_s": _since(start, e["t"])}
            for e in events if e["event"] == "worker_banned"]
