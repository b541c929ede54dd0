"""`swarm bench verify`: honest and attacked rollout groups through the batched verifier, timed.

Generation uses the production torch backend (inference.TorchBackend: batched KV-cached decoding, seeded Gumbel-max
sampling, TOPLOC proofs built from the captured LM-head inputs); proof building is timed through the backend's
proof_fn hook. Honest groups are verified three ways (all groups in one padded prefill, one group at a time, and
in small batches in reverse order) so batch composition and padding always differ from the generator's.
"""

from __future__ import annotations

import copy
import dataclasses
import sys
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from swarm.bench import attacks
from tasks.assignment import assign_tasks
from tasks.loading import load_tasks
from verify.checks import CheckConfig, RunContext
from verify.provider import TaskSetProvider
from verify.verifier import verify_groups

if TYPE_CHECKING:
    from verify.rollout import RolloutGroup
    from verify.verdicts import Verdict

CURRENT_VERSION = 3
ASYNC_WINDOW = 2


@dataclass(frozen=True)
class BenchConfig:
    """model: "tiny", "smollm2" or a directory; groups: groups per case; group_size: completions per group;
    max_new_tokens: the stage's limit; temperature: the claimed sampling temperature; tokens_replaced: k of the
    replaced-tokens attack; threads: torch intra-op threads (1 is fastest for tiny models on a busy box);
    min_eos_prob: the termination rule's P(EOS) floor; None means INTELLECT-2's 0.1, except 0.0 for the random-init
    "tiny" model, whose EOS probability is never concentrated, so an honest EOS is almost always below 0.1.
    The history section's sizes default to the command line's; its full size is `--honest-groups 2000 --per-worker 100
    --attempts 100`."""

    model: str = "tiny"
    groups: int = 20
    group_size: int = 4
    max_new_tokens: int = 64
    temperature: float = 0.8
    tokens_replaced: int = 4
    threads: int = 1
    seed: int = 0
    min_eos_prob: float | None = None
    honest_only: bool = False  # only the honest cases: the cost figures of a model too slow on CPU for every attack
    precision: str = "float32"  # what every worker (honest or not) generates in; validators stay float32
    history: str = "on"  # the worker-history section (swarm/bench/verify_history.py): "on", "off" or "only"
    honest_groups: int = 200  # honest groups of that section, `per_worker` per worker
    per_worker: int = 20
    attempts: int = 20  # attacking workers (or single groups) per class of that section

    def check_config(self) -> CheckConfig:
        floor = self.min_eos_prob
        if floor is None:
            floor = 0.0 if self.model == "tiny" else CheckConfig().min_eos_prob
        return CheckConfig.for_precision(self.precision, min_eos_prob=floor)


class Harness:
    """One loaded policy, its task set, a run context and timed generation / validation."""

    def __init__(self, config: BenchConfig) -> None:
        from inference.models import load_model

        self.config = config
        self.loaded = load_model(config.model)
        self.model = self.loaded.model
        self.tasks = load_tasks("basic_arithmetic", size=max(64, 4 * config.groups), seed=config.seed)
        manifests = {v: bytes([v + 1]) * 32 for v in range(CURRENT_VERSION + 1)}
        self.ctx = RunContext(
            run="bench", current_version=CURRENT_VERSION, async_window=ASYNC_WINDOW, manifest_ids=manifests,
            max_new_tokens=config.max_new_tokens, dataset=self.tasks.name, eligible=self.tasks.indices(),
            prompts_per_step=2, eos_ids=tuple(self.loaded.eos_token_ids),
            tasks=TaskSetProvider({self.tasks.name: self.tasks}, self.loaded.tokenizer),
            temperature=config.temperature, group_size=config.group_size)
        self.proof_s = 0.0
        from verify.toploc import build_proofs

        build_proofs([torch.zeros(33, self.model.config.hidden_size)])  # one-off table builds stay out of timings

    def _timed_proofs(self, hiddens: list[torch.Tensor]):
        from verify.toploc import build_proofs

        start = time.perf_counter()
        proofs = build_proofs(hiddens)
        self.proof_s += time.perf_counter() - start
        return proofs

    def items(self, tag: str, *, assigned: bool = True) -> list[tuple[str, int, int]]:
        """(worker, step, task index) per group: the worker's first assigned prompt, or one it was not assigned."""

        out = []
        for i in range(self.config.groups):
            worker, step = f"{tag}-{i}", i
            picks = assign_tasks(self.ctx.run, worker, step, self.ctx.eligible, self.ctx.prompts_per_step)
            index = picks[0] if assigned else next(j for j in self.ctx.eligible if j not in picks)
            out.append((worker, step, index))
        return out

    def generate(self, model: torch.nn.Module, items: list[tuple[str, int, int]], *,
                 temperature: float | None = None, version: int = CURRENT_VERSION,
                 group_size: int | None = None):
        """Groups generated by `model` (the run's group size unless `group_size`); returns (groups, gen_s,
        proof_build_s)."""
        from inference.backend import GroupResult
        from inference.rollouts import build_rollout_group, make_request
        from inference.torch_backend import TorchBackend

        if self.config.precision == "bfloat16":  # as vLLM on a GPU: weights and activations in bf16
            model = copy.deepcopy(model).to(torch.bfloat16)
        loaded = dataclasses.replace(self.loaded, model=model)
        backend = TorchBackend(loaded, proof_fn=self._timed_proofs)
        backend.policy_version, backend.manifest_id = version, self.ctx.manifest_ids[version]
        cfg = self.config
        entries = [self.tasks[index] for _, _, index in items]
        requests = [make_request(self.loaded.tokenizer, entry, run=self.ctx.run, worker=w, step=s,
                                 group_size=group_size or cfg.group_size, temperature=temperature or cfg.temperature,
                                 max_new_tokens=cfg.max_new_tokens) for (w, s, _), entry in zip(items, entries)]
        self.proof_s = 0.0
        start = time.perf_counter()
        results: list[GroupResult] = backend.generate(requests)
        gen_s = time.perf_counter() - start
        groups = [build_rollout_group(r, e, self.loaded.tokenizer, run=self.ctx.run, worker=w, step=s)
                  for r, e, (w, s, _) in zip(results, entries, items)]
        return groups, gen_s, self.proof_s

    def validate(self, groups: list[RolloutGroup], config: CheckConfig | None = None,
                 model: torch.nn.Module | None = None, **kwargs):
        """Verdicts on `groups` by `model` (the harness's own by default); returns (verdicts, validate_s)."""
        start = time.perf_counter()
        verdicts = verify_groups({CURRENT_VERSION: model or self.model}, groups, self.ctx,
                                 config or self.config.check_config(), **kwargs)
        return verdicts, time.perf_counter() - start


def _progress(row: dict) -> dict:
    """Each finished case as one line on stderr, so a long run shows where it is (stdout keeps the JSON)."""

    print(f"bench verify: {row['case']}: {row['rejected']}/{row['groups']} rejected, gen {row['gen_s']} s, "
          f"validate {row['validate_s']} s", file=sys.stderr, flush=True)
    return row


def _row(case: str, kind: str, verdicts: list[Verdict], gen_s: float, proof_s: float, validate_s: float,
         groups: list[RolloutGroup]) -> dict:
    rejected_by: dict[str, int] = {}
    for v in verdicts:
        for c in v.checks:
            if not c.ok:
                rejected_by[c.name] = rejected_by.get(c.name, 0) + 1
    tokens = sum(len(c.tokens) for g in groups for c in g.completions)
    proof_bytes = sum(len(c.proof) for g in groups for c in g.completions)
    chunks = sum(-(-len(c.tokens) // 32) for g in groups for c in g.completions)
    return _progress({
        "case": case, "kind": kind, "groups": len(verdicts), "rejected": sum(not v.accepted for v in verdicts),
        "gen_s": round(gen_s, 4), "proof_build_s": round(proof_s, 4), "validate_s": round(validate_s, 4),
        "tokens": tokens, "proof_bytes_per_chunk": round(proof_bytes / max(1, chunks), 2), "rejected_by": rejected_by,
        "first_reason": next((v.reason for v in verdicts if not v.accepted), ""),
    })


def run_cases(config: BenchConfig) -> tuple[Harness, dict]:
    """Every honest and attacked case, in order: the harness (its honest groups feed the history section of
    swarm.bench.verify_history) and the JSON-able report."""
    torch.set_num_threads(config.threads)
    torch.manual_seed(config.seed)
    h = Harness(config)
    rows = [] if config.history == "only" and not config.honest_only else _honest_cases(h)
    if not config.honest_only and config.history != "only":
        rows += _weight_attacks(h) + _rollout_attacks(h)
    report = {"model": config.model, "config": dataclasses.asdict(config),
              "checks": dataclasses.asdict(config.check_config()), "cases": rows,
              "summary": _summary(rows, config.precision)}
    return h, report


def _honest_cases(h: Harness) -> list[dict]:
    groups, gen_s, proof_s = h.generate(h.model, h.items("honest"))
    h.honest = (groups, gen_s, proof_s)
    together, t1 = h.validate(groups)
    alone_pairs = [h.validate([g]) for g in groups]
    small, t3 = h.validate(list(reversed(groups)), max_batch_tokens=256)
    alone = [v for vs, _ in alone_pairs for v in vs]
    rows = [
        _row("honest_one_padded_batch", "honest", together, gen_s, proof_s, t1, groups),
        _row("honest_each_group_alone", "honest", alone, gen_s, proof_s, sum(t for _, t in alone_pairs), groups),
        _row("honest_small_batches_reversed", "honest", small, gen_s, proof_s, t3, groups),
    ]
    if _same_kernels(h):
        strict, t4 = h.validate(groups, config=_strict(h))
        rows.append(_row("honest_fp32_same_kernels_toploc", "honest", strict, gen_s, proof_s, t4, groups))
    return rows


def _same_kernels(h: Harness) -> bool:
    """Whether workers run the validator's own float32 kernels, the only setting FP32_SAME_KERNELS is for."""
    return h.config.precision == "float32"


def _strict(h: Harness) -> CheckConfig:
    from verify.toploc import FP32_SAME_KERNELS

    return dataclasses.replace(h.config.check_config(), toploc=FP32_SAME_KERNELS)


def _weight_attacks(h: Harness) -> list[dict]:
    seed = h.config.seed
    # Factories, so only one tampered copy of the weights is alive at a time (they are model-sized).
    cases = [
        ("other_model_same_shape", lambda: attacks.other_model(h.model, seed + 1), {}),
        ("weights_perturbed_1e-3", lambda: attacks.perturbed_model(h.model, 1e-3, seed + 2), {}),
        ("int8_quantised", lambda: attacks.int8_model(h.model), {}),
        ("sampled_at_other_temperature", lambda: h.model, {"temperature": h.config.temperature * 1.5}),
        ("older_version_replayed", lambda: attacks.perturbed_model(h.model, 5e-2, seed + 3),
         {"version": CURRENT_VERSION - ASYNC_WINDOW - 1}),
    ]
    rows = []
    for name, make_model, kwargs in cases:
        groups, gen_s, proof_s = h.generate(make_model(), h.items(name), **kwargs)
        if "temperature" in kwargs:
            groups = [dataclasses.replace(g, temperature=h.config.temperature) for g in groups]
        verdicts, val_s = h.validate(groups)
        rows.append(_row(name, "attack", verdicts, gen_s, proof_s, val_s, groups))
        if name == "weights_perturbed_1e-3" and _same_kernels(h):
            verdicts, val_s = h.validate(groups, config=_strict(h))
            rows.append(_row(name + "_fp32_same_kernels_toploc", "attack", verdicts, gen_s, proof_s, val_s, groups))
        if "version" in kwargs:  # the same old rollouts, relabelled as the current version
            current = h.ctx.manifest_ids[CURRENT_VERSION]
            groups = [dataclasses.replace(g, policy_version=CURRENT_VERSION, manifest_id=current) for g in groups]
            verdicts, val_s = h.validate(groups)
            rows.append(_row("older_version_relabelled_current", "attack", verdicts, gen_s, proof_s, val_s, groups))
    small = attacks.smaller_model(h.model, seed + 4)
    groups, gen_s, proof_s = h.generate(small, h.items("smaller"))
    groups = [attacks.reprove(h.model, g) for g in groups]
    verdicts, val_s = h.validate(groups)
    rows.append(_row("smaller_model_completion_reproved", "attack", verdicts, gen_s, proof_s, val_s, groups))
    groups, gen_s, proof_s = h.generate(h.model, h.items("unassigned", assigned=False))
    verdicts, val_s = h.validate(groups)
    rows.append(_row("unassigned_prompt", "attack", verdicts, gen_s, proof_s, val_s, groups))
    return rows


def _rollout_attacks(h: Harness) -> list[dict]:
    """Attacks that edit the honest groups after generation (gen_s is the honest generation they reuse)."""
    honest, gen_s, proof_s = h.honest
    vocab, eos = h.model.config.vocab_size, h.ctx.eos_ids
    edits = {
        f"{h.config.tokens_replaced}_tokens_replaced_reproved": lambda g, i: attacks.reprove(
            h.model, attacks.replace_tokens(g, h.config.tokens_replaced, vocab, eos, i)),
        "completion_truncated_reproved": lambda g, i: attacks.reprove(h.model, attacks.truncate(g)),
        "fabricated_reward": lambda g, i: attacks.fabricate_reward(g),
    }
    rows = []
    for name, edit in edits.items():
        groups = [edit(g, i) for i, g in enumerate(honest)]
        verdicts, val_s = h.validate(groups)
        rows.append(_row(name, "attack", verdicts, gen_s, proof_s, val_s, groups))
    return rows


NOTES = {
    "weights_perturbed_1e-3": (
        "1e-3 relative weight noise moves the last hidden states by about 1e-3 relative, a quarter of one bf16 "
        "ulp, far inside TOPLOC's reference tolerance for cross-GPU noise (mean mantissa error about 0.2 of the "
        "allowed 10); it is caught only where it flips a seeded Gumbel-max argmax or moves a logprob beyond the "
        "tolerance, which needs long completions. Validators sharing the workers' float32 kernels catch it with "
        "the FP32_SAME_KERNELS TOPLOC profile (see the _fp32_same_kernels_toploc row)"),
}


BF16_NOTE = (
    "bf16 workers: two honest bf16 kernels already disagree on logits by more than this attack moves them, so the "
    "tolerances widened for bf16 (CheckConfig.for_precision) and TOPLOC's reference thresholds, built for "
    "cross-GPU bf16 noise, both absorb it; only float32 runs with shared kernels can tell it apart")


def _why_undetected(case: str, precision: str) -> str:
    if precision == "bfloat16" and case in ("weights_perturbed_1e-3", "int8_quantised"):
        return BF16_NOTE
    return NOTES.get(case, "see first_reason and rejected_by")


def _summary(rows: list[dict], precision: str = "float32") -> dict:
    honest = [r for r in rows if r["kind"] == "honest"]
    attack_rows = [r for r in rows if r["kind"] == "attack"]
    gen = honest[0]["gen_s"] if honest else 0.0
    weak = {r["case"]: round(r["rejected"] / max(1, r["groups"]), 4) for r in attack_rows
            if r["rejected"] < 0.99 * r["groups"]}
    return {
        "honest_groups": honest[0]["groups"] if honest else 0,
        "false_rejects": sum(r["rejected"] for r in honest),
        "attacks_below_99pct": weak,
        "why_undetected": {case: _why_undetected(case, precision) for case in weak},
        "proof_build_share_of_gen": round(honest[0]["proof_build_s"] / gen, 4) if gen else None,
        "validate_share_of_gen": round(honest[0]["validate_s"] / gen, 4) if gen else None,
        "proof_bytes_per_32_tokens": sorted({r["proof_bytes_per_chunk"] for r in rows}),
    }
