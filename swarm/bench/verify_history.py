"""`swarm bench verify`'s worker-history section: honest near-tie rates, the attacks a single group's checks let
through, and what a worker's history costs a validator.

Why a section of its own: these attacks are judged per worker, not per group. An attempt is one attacking worker
sending up to `max_groups` groups (generated `round_groups` at a time, so a worker banned early costs little); it is
caught when every group it sent was rejected or its worker was banned within `max_groups` groups. The classes that
one group already betrays (another sampling setting honestly labelled, another group size, a near-duplicate of an
accepted group) are one group per attempt. Honest workers send `per_worker` groups each, through the same
validator and the same history, so the false bans are those of long-lived workers.
"""

from __future__ import annotations

import math
import sys
import time
import tracemalloc
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from swarm.bench import attacks
from swarm.bench.verify_harness import CURRENT_VERSION, Harness, _same_kernels, _strict
from tasks.assignment import assign_tasks
from verify.neartie import GAP_EDGES, NO_NEAR_TIES, NearTies, count_near_ties, near_ties_of
from verify.slots import SlotLedger, first_answers
from verify.worker_history import HistoryConfig, WorkerHistory, log_evidence

if TYPE_CHECKING:
    from verify.rollout import RolloutGroup

CHUNK_GROUPS = 50  # honest groups generated and validated at a time (bounded memory)


@dataclass(frozen=True)
class HistoryBenchConfig:
    """honest_groups: honest groups in all; per_worker: honest groups per worker; attempts: attacking workers (or
    groups, for the one-group classes) per class; max_groups: groups an attacking worker may send before it counts
    as not caught (the issue's 20); round_groups: groups generated per attacking worker at a time."""

    honest_groups: int = 2000
    per_worker: int = 100
    attempts: int = 100
    max_groups: int = 20
    round_groups: int = 4


def _progress(line: str) -> None:
    """One line on stderr per finished stage, so a long run shows where it is (stdout keeps the JSON)."""

    print(f"bench verify history: {line}", file=sys.stderr, flush=True)


def worker_items(h: Harness, tag: str, workers: list[str], steps: range) -> list[tuple[str, int, int]]:
    """(worker, step, task index) for each worker and step: the worker's first prompt assigned at that step."""

    return [(w, s, assign_tasks(h.ctx.run, w, s, h.ctx.eligible, h.ctx.prompts_per_step)[0])
            for w in workers for s in steps]


def run_history(h: Harness, cfg: HistoryBenchConfig) -> dict:
    """The section's report: honest figures, one row per attack class, the history's cost, and the targets."""
    history_config = HistoryConfig.for_precision(h.config.precision)
    honest, accepted = _honest(h, cfg, history_config)
    classes = [*_one_group_classes(h, cfg, accepted), *_worker_classes(h, cfg, history_config)]
    caught_all = all(c["caught_rate"] >= 0.99 and c["attempts"] >= 100 for c in classes)
    return {
        "config": {"bench": cfg.__dict__, "history": {**history_config.__dict__, "rates": history_config.rates()}},
        "honest": honest, "classes": classes, "cost": _cost(history_config),
        "targets_met": {"honest": honest["groups"] >= 2000 and honest["false_rejects"] == 0
                        and honest["false_bans"] == 0, "every_class_caught_99pct": caught_all},
    }


def _honest(h: Harness, cfg: HistoryBenchConfig, history_config: HistoryConfig) -> tuple[dict, list]:
    """Honest workers through the validator and a history: near-tie figures, false rejects and false bans."""
    workers = [f"honest-w{i}" for i in range(max(1, -(-cfg.honest_groups // cfg.per_worker)))]
    items = worker_items(h, "honest", workers, range(cfg.per_worker))[: cfg.honest_groups]
    history, accepted = WorkerHistory(history_config), []
    per_group, total, rejects, strict_rejects, observe_s = Counter(), NO_NEAR_TIES, 0, 0, 0.0
    for start in range(0, len(items), CHUNK_GROUPS):
        chunk = items[start:start + CHUNK_GROUPS]
        groups, _, _ = h.generate(h.model, chunk)
        verdicts, _ = h.validate(groups)
        if _same_kernels(h):
            strict_rejects += sum(not v.accepted for v in h.validate(groups, config=_strict(h))[0])
        for (worker, _, _), group, verdict in zip(chunk, groups, verdicts):
            rejects += not verdict.accepted
            record = near_ties_of(verdict) or NO_NEAR_TIES
            per_group[record.flips] += 1
            total = total + record
            began = time.perf_counter()
            history.observe(worker, record)
            observe_s += time.perf_counter() - began
            if verdict.accepted and len(accepted) < cfg.attempts:
                accepted.append(group)
    evidence = [_log_evidence(history, w) for w in workers]
    _progress(f"honest: {len(items)} groups, {total.flips} flips in {total.tokens} tokens, {rejects} rejected")
    return {
        "groups": len(items), "workers": len(workers), "tokens": total.tokens, "flips": total.flips,
        "flip_rate_per_token": total.flips / max(1, total.tokens),
        "flip_rate_95pct_upper": _upper_95(total.flips, total.tokens),
        "flips_per_group": dict(sorted(per_group.items())), "gap_bins": _gap_bins(total),
        "false_rejects": rejects,
        "false_rejects_fp32_same_kernels_toploc": strict_rejects if _same_kernels(h) else None,
        "false_bans": sum(history.is_banned(w) for w in workers),
        "max_log_evidence": round(max(evidence), 3),
        "ban_log_threshold": round(math.log(1 / history_config.false_ban), 3),
        "observe_s_per_group": observe_s / max(1, len(items)),
    }, accepted


def _log_evidence(history: WorkerHistory, worker: str) -> float:
    _, total = history.totals(worker)
    return log_evidence(history.config, total.tokens, total.flips)


def _upper_95(flips: int, tokens: int) -> float:
    """A one-sided 95 % upper bound on a per-token rate (Wilson score; 3 / n when nothing was seen)."""
    if tokens == 0:
        return 1.0
    if flips == 0:
        return 3.0 / tokens
    p, z = flips / tokens, 1.645
    centre = p + z * z / (2 * tokens)
    spread = z * (p * (1 - p) / tokens + z * z / (4 * tokens * tokens)) ** 0.5
    return (centre + spread) / (1 + z * z / tokens)


def _gap_bins(record: NearTies) -> dict[str, int]:
    labels = [f"<={e:g}" for e in GAP_EDGES] + [f">{GAP_EDGES[-1]:g}"]
    return dict(zip(labels, record.gap_bins))


def _one_group_classes(h: Harness, cfg: HistoryBenchConfig, accepted: list) -> list[dict]:
    """The attacks one group betrays: each attempt is one group of a fresh worker."""
    workers = lambda tag: [f"{tag}-{i}" for i in range(cfg.attempts)]  # noqa: E731
    hotter, _, _ = h.generate(h.model, worker_items(h, "temp", workers("temp"), range(1)),
                              temperature=h.config.temperature * 1.5)
    sizes = [h.config.group_size + (1 if i % 2 else -1) or 2 for i in range(cfg.attempts)]
    resized = []
    for size in sorted(set(sizes)):
        picked = [w for w, s in zip(workers("size"), sizes) if s == size]
        resized += h.generate(h.model, worker_items(h, "size", picked, range(1)), group_size=size)[0]
    edits = (lambda g: attacks.jitter_logprob(g, 0.01), attacks.completion_subset, attacks.reorder_completions)
    duplicates = [edits[i % 3](g) for i, g in enumerate(accepted)]
    return [_one_group_row(h, "other_temperature_labelled", hotter),
            _one_group_row(h, "other_group_size", resized),
            _one_group_row(h, "near_duplicate_resubmitted", duplicates, _after_originals(h, accepted, duplicates))]


def _after_originals(h: Harness, originals: list, resubmitted: list) -> tuple[list, float]:
    """Verdicts on resubmissions by a validator that checked the originals first, as swarm/roles/validator.py does:
    its one-rollout-per-slot ledger (verify.slots) refuses a second group for a slot, and only a variant whose slot
    is new (none here) would reach the checks."""

    ledger = SlotLedger()
    first_answers(ledger, originals)
    fresh, refused = first_answers(ledger, resubmitted)
    checked, val_s = h.validate(fresh) if fresh else ([], 0.0)
    by_id = {v.rollout_id: v for v in [*checked, *refused]}
    return [by_id[g.rollout_id()] for g in resubmitted], val_s


def _one_group_row(h: Harness, name: str, groups: list, judged: tuple[list, float] | None = None) -> dict:
    verdicts, val_s = judged or h.validate(groups)
    rejected = sum(not v.accepted for v in verdicts)
    _progress(f"{name}: {rejected}/{len(groups)} rejected")
    return {"class": name, "attempts": len(groups), "groups": len(groups), "rejected": rejected, "banned": 0,
            "caught": rejected, "caught_rate": rejected / max(1, len(groups)), "banned_after_groups": {},
            "accepted_before_caught": len(groups) - rejected,
            "first_reason": next((v.reason for v in verdicts if not v.accepted), ""), "validate_s": round(val_s, 4)}


def _worker_classes(h: Harness, cfg: HistoryBenchConfig, history_config: HistoryConfig) -> list[dict]:
    """The attacks only a worker's history betrays: a cheaper decoder and near-tie steering."""
    from verify.testing import honest_group

    cheap = attacks.int8_model(h.model)
    checks = h.config.check_config()

    def int8_reproved(items: list[tuple[str, int, int]]) -> list[RolloutGroup]:
        return [attacks.reprove(h.model, g) for g in h.generate(cheap, items)[0]]

    def steered(items: list[tuple[str, int, int]]) -> list[RolloutGroup]:
        return [honest_group(h.model, h.ctx, worker=w, step=s, version=CURRENT_VERSION,
                             group_size=h.config.group_size, temperature=h.config.temperature,
                             choose=attacks.NearTieSteerer(checks.near_tie_tol, checks.max_near_tie_fraction))
                for w, s, _ in items]

    return [_worker_row(h, cfg, history_config, "int8_decoded_reproved", int8_reproved),
            _worker_row(h, cfg, history_config, "near_ties_steered", steered)]


def _worker_row(h: Harness, cfg: HistoryBenchConfig, history_config: HistoryConfig, name: str,
                make: Callable[[list[tuple[str, int, int]]], list[RolloutGroup]]) -> dict:
    """Attacking workers send groups round by round until banned or `max_groups` are sent."""
    history = WorkerHistory(history_config)
    workers = [f"{name}-{a}" for a in range(cfg.attempts)]
    sent, rejected, banned_at, total = Counter(), Counter(), {}, NO_NEAR_TIES
    for start in range(0, cfg.max_groups, cfg.round_groups):
        live = [w for w in workers if w not in banned_at]
        if not live:
            break
        items = worker_items(h, name, live, range(start, min(cfg.max_groups, start + cfg.round_groups)))
        verdicts, _ = h.validate(make(items))
        for (worker, _, _), verdict in zip(items, verdicts):
            if worker in banned_at:  # a banned worker's later groups are refused unchecked
                continue
            sent[worker] += 1
            rejected[worker] += not verdict.accepted
            record = near_ties_of(verdict) or NO_NEAR_TIES
            total = total + record
            if history.observe(worker, record).newly_banned:
                banned_at[worker] = sent[worker]
    caught = [w for w in workers if w in banned_at or rejected[w] == sent[w]]
    _progress(f"{name}: {len(caught)}/{len(workers)} workers caught, {len(banned_at)} banned")
    return {"class": name, "attempts": len(workers), "groups": sum(sent.values()), "rejected": sum(rejected.values()),
            "banned": len(banned_at), "caught": len(caught), "caught_rate": len(caught) / max(1, len(workers)),
            "banned_after_groups": dict(sorted(Counter(banned_at.values()).items())),
            "accepted_before_caught": sum(sent[w] - rejected[w] for w in workers),
            "flip_rate_per_token": total.flips / max(1, total.tokens), "gap_bins": _gap_bins(total),
            "first_reason": history.ban_reason(next(iter(banned_at), ""))}


def _cost(history_config: HistoryConfig) -> dict:
    """What a worker's history costs a validator: counting a group's flips (the observe time per group is the
    honest section's), and the memory of one worker's record."""

    def per_call(gaps: torch.Tensor) -> float:
        began = time.perf_counter()
        for _ in range(200):
            count_near_ties(gaps)
        return (time.perf_counter() - began) / 200

    gaps = torch.zeros(256)  # a group of 4 x 64 tokens: an honest one has no flip (one reduction)
    honest_s = per_call(gaps)
    gaps[::64] = 1e-3  # and one with 4 flips, binned
    flipped_s, record = per_call(gaps), count_near_ties(gaps)
    tracemalloc.start()
    history = WorkerHistory(history_config)
    before = tracemalloc.get_traced_memory()[0]
    for i in range(1000):
        history.observe(f"worker-{i:06d}", record)
    per_worker = (tracemalloc.get_traced_memory()[0] - before) / 1000
    tracemalloc.stop()
    return {"count_s_per_group_without_flips": honest_s, "count_s_per_group_with_flips": flipped_s,
            "bytes_per_worker": round(per_worker), "max_bytes": round(per_worker * history_config.max_workers),
            "max_workers": history_config.max_workers}
