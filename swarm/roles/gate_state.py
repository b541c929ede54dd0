"""The gate's judgements as plain JSON values, for the trainer's checkpoint: near-tie histories and bans, reputation
scores and bans, probation records.

Why: a cheater banned by the gate, or a validator banned for lying, would otherwise start afresh whenever the trainer
restarts, and every worker's record would be lost with it (so every worker would serve its probation again). The
trainer puts `snapshot(gate)` into its TrainerState before each step, so every checkpoint carries it (written with
the checkpoint's state.json, atomically: trainer.checkpoint), and a resumed trainer passes it to `restore`.

Bounded: each table holds at most its own bound (HistoryConfig.max_workers per precision, ReputationConfig.max_peers,
ProbationConfig.max_workers for each kind), so a snapshot is at most a few MB however many identities the run saw.
Validated on load, as any input from disk: every table, entry and field is checked for type, range and bound before
any of it replaces the gate's state; a malformed state refuses the resume with one sentence saying why.
"""

from __future__ import annotations

import math

from swarm.roles.gate_evidence import GateEvidence
from swarm.roles.gate_probation import Probation
from trainer.errors import TrainerError
from verify.reputation import Reputation
from verify.worker_history import HistoryConfig

FORMAT = 1
MAX_NAME = 128  # characters of a worker name (peer ids are about 52)
MAX_REASON = 1000


def snapshot(evidence: GateEvidence, reputation: Reputation, probation: Probation) -> dict:
    """The gate's judgements as JSON values (see the module docstring)."""
    scores, banned = reputation.export()
    proving = probation.export()
    return {
        "format": FORMAT,
        "histories": {precision: {"records": [list(r) for r in records], "banned": [list(b) for b in bans]}
                      for precision, (records, bans) in evidence.export().items()},
        "reputation": {"scores": [[*_peer_out(peer), score] for peer, score in scores],
                       "banned": [_peer_out(peer) for peer in banned]},
        "probation": {"unproven": proving["unproven"], "proven": proving["proven"]},
    }


def restore(evidence: GateEvidence, reputation: Reputation, probation: Probation, data: object) -> None:
    """Replace the gate's judgements by a snapshot's; None (a checkpoint without one) leaves the gate as it is."""
    if data is None:
        return
    try:
        histories, scores, banned, unproven, proven = _parse(data, reputation.config.max_peers,
                                                             probation.config.max_workers)
    except (TypeError, ValueError, KeyError) as exc:
        raise TrainerError(f"the gate state in the checkpoint is malformed ({str(exc)[:160]}); remove its \"gate\" "
                           "entry from state.json to resume with no worker judged") from None
    evidence.load(histories)
    reputation.load(scores, banned)
    probation.load(unproven, proven)


def _parse(data: object, max_peers: int, max_proving: int) -> tuple:
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise ValueError(f"format {data.get('format') if isinstance(data, dict) else None!r} is not {FORMAT}")
    max_workers = HistoryConfig().max_workers
    histories = {}
    for precision, table in _dict(data["histories"], 2).items():
        HistoryConfig.for_precision(precision)  # ValueError for an unknown precision
        records = [_record(item) for item in _list(table["records"], max_workers)]
        bans = [(_name(w), _text(reason)) for w, reason in map(_pair, _list(table["banned"], max_workers))]
        histories[precision] = (records, bans)
    reputation = _dict(data["reputation"], 2)
    scores = [(_peer_in(item[:2]), _score(item[2])) for item in _list(reputation["scores"], max_peers, width=3)]
    banned = [_peer_in(item) for item in _list(reputation["banned"], max_peers, width=2)]
    probation = _dict(data["probation"], 2)
    unproven = [(_name(w), _count(n)) for w, n in map(_pair, _list(probation["unproven"], max_proving))]
    proven = [_name(w) for w in _list(probation["proven"], max_proving)]
    return histories, scores, banned, unproven, proven


def _dict(value: object, bound: int) -> dict:
    if not isinstance(value, dict) or len(value) > bound:
        raise ValueError(f"expected a table of at most {bound} entries")
    return value


def _list(value: object, bound: int, width: int | None = None) -> list:
    if not isinstance(value, list) or len(value) > bound:
        raise ValueError(f"expected a list of at most {bound} entries")
    if width is not None and not all(isinstance(item, list) and len(item) == width for item in value):
        raise ValueError(f"expected entries of {width} values")
    return value


def _pair(item: object) -> list:
    if not isinstance(item, list) or len(item) != 2:
        raise ValueError("expected entries of 2 values")
    return item


def _record(item: object) -> tuple[str, int, int, int]:
    if not isinstance(item, list) or len(item) != 4:
        raise ValueError("expected history records of 4 values")
    worker, groups, tokens, flips = _name(item[0]), _count(item[1]), _count(item[2]), _count(item[3])
    if flips > tokens:
        raise ValueError(f"a record of {worker!r} has more flips than tokens")
    return worker, groups, tokens, flips


def _name(value: object) -> str:
    if not isinstance(value, str) or not 0 < len(value) <= MAX_NAME:
        raise ValueError(f"a worker name must be 1 to {MAX_NAME} characters")
    return value


def _text(value: object) -> str:
    if not isinstance(value, str) or len(value) > MAX_REASON:
        raise ValueError(f"a ban reason must be text of at most {MAX_REASON} characters")
    return value


def _count(value: object) -> int:
    if type(value) is not int or not 0 <= value < 2**53:
        raise ValueError("a count must be a non-negative integer")
    return value


def _score(value: object) -> float:
    if type(value) not in (int, float) or not math.isfinite(value) or abs(value) > 1e9:
        raise ValueError("a score must be a finite number")
    return float(value)


def _peer_out(peer: str | bytes) -> list:
    """A reputation key as JSON: ["worker", name] or ["validator", hex key]."""
    return ["validator", peer.hex()] if isinstance(peer, bytes) else ["worker", str(peer)]


def _peer_in(item: list) -> str | bytes:
    kind, ident = item
    if kind == "worker":
        return _name(ident)
    if kind == "validator" and isinstance(ident, str) and len(ident) == 64:
        return bytes.fromhex(ident)
    raise ValueError(f"unknown reputation key {str(kind)[:20]!r}")
