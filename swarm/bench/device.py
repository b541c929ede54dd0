"""`swarm bench device`: every accelerator path of the project against its CPU twin, in one short run.

Why: GPUs are lent rarely and briefly, and none of the device paths (the noise draw, the torch backend, the
verifier, the trainer step) can be exercised on a CPU-only machine. This command is the prepared check to run the
moment one is there: on the tiny model it runs each path on `--device` and on the CPU from the same weights and
inputs and prints how far they agree (JSON), with `ok` per part. On a CPU (`--device cpu`) it checks itself: every
figure must be exact there.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import json
import time
from typing import TYPE_CHECKING

import numpy as np

from swarm.errors import require_at_least_one
from trainer.admission import GenerationContract
from trainer.config import TrainerConfig

if TYPE_CHECKING:
    import torch

    from swarm.bench.verify_harness import Harness


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--device", default="cuda", help="the device to check against the CPU (default cuda)")
    parser.add_argument("--model", default="tiny", help="tiny | smollm2 | a local model directory (default tiny)")
    parser.add_argument("--groups", type=int, default=8, help="rollout groups generated per side (default 8)")
    parser.add_argument("--max-new-tokens", type=int, default=32, help="generation limit (default 32)")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of an indented one")


def run(args: argparse.Namespace) -> int:
    import torch

    from inference.select import resolve_device
    from swarm.bench.verify_harness import BenchConfig, Harness

    require_at_least_one(groups=args.groups, max_new_tokens=args.max_new_tokens)
    device = resolve_device(args.device)
    torch.set_num_threads(1)
    harness = Harness(BenchConfig(model=args.model, groups=args.groups, max_new_tokens=args.max_new_tokens))
    # Copies made before any generation: a backend hooks the models it runs, and hooked modules do not copy.
    on_device = copy.deepcopy(harness.model).to(device)
    trainees = (copy.deepcopy(harness.model), copy.deepcopy(harness.model).to(device))
    exact = device.type == "cpu"
    report = {"device": str(device), "model": args.model, "noise": _noise(device, exact)}
    report["generate"], groups = _generate(harness, on_device)
    report["verify"] = _verify(harness, on_device, groups)
    report["train_step"] = _train_step(harness, trainees, groups["cpu"], exact)
    report["ok"] = all(part["ok"] for part in report.values() if isinstance(part, dict))
    print(json.dumps(report, indent=None if args.json else 2))
    return 0


def _noise(device: torch.device, exact: bool) -> dict:
    """The Gumbel draw on the device against the CPU's: the same up to a float32 ulp of the log."""

    from verify.sampling import gumbel_noise_at

    seeds, positions = np.arange(1, 65, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15), np.arange(64)
    cpu = gumbel_noise_at(seeds, positions, 49152)
    there = gumbel_noise_at(seeds, positions, 49152, device).cpu()
    worst = float((cpu - there).abs().max())
    return {"max_abs_difference": worst, "equal_fraction": round(float((cpu == there).double().mean()), 6),
            "ok": worst == 0.0 if exact else worst < 1e-5}


def _generate(harness: Harness, on_device: torch.nn.Module) -> tuple[dict, dict]:
    """The same prompts and sampling keys on both sides; completions should agree but for rare near-ties."""
    items = harness.items("device")
    cpu, cpu_s, _ = harness.generate(harness.model, items)
    there, there_s, _ = harness.generate(on_device, items)
    pairs = [(a.tokens, b.tokens) for ga, gb in zip(cpu, there) for a, b in zip(ga.completions, gb.completions)]
    identical = sum(a == b for a, b in pairs) / len(pairs)
    report = {"completions": len(pairs), "identical_fraction": round(identical, 4), "cpu_s": round(cpu_s, 3),
              "device_s": round(there_s, 3), "ok": identical >= 0.5}
    return report, {"cpu": cpu, "device": there}


def _verify(harness: Harness, on_device: torch.nn.Module, groups: dict) -> dict:
    """Groups made on each side, validated on the other: honest work must pass across devices."""
    on_cpu, _ = harness.validate(groups["device"])
    there, _ = harness.validate(groups["cpu"], model=on_device)
    reasons = [v.reason for v in list(on_cpu) + list(there) if not v.accepted]
    return {"device_groups_rejected_on_cpu": sum(not v.accepted for v in on_cpu),
            "cpu_groups_rejected_on_device": sum(not v.accepted for v in there),
            "first_reason": reasons[0] if reasons else "", "ok": not reasons}


def _train_step(harness: Harness, trainees: tuple, groups: list, exact: bool) -> dict:
    """One GRPO step from the same weights and batch on each side (trainees: the CPU model and the device model):
    loss, gradient norm and the weights after it."""
    from trainer.loop import to_train_group
    from trainer.step import PolicyTrainer

    bench = harness.config
    contract = GenerationContract(bench.group_size, bench.temperature, bench.max_new_tokens)
    # Alternating rewards: every group carries a learning signal, whatever the tiny model scored.
    batch = [to_train_group(g, contract) for g in groups]
    batch = [dataclasses.replace(t, rewards=tuple(float(i % 2) for i in range(len(t.completions)))) for t in batch]
    pad = harness.loaded.tokenizer.pad_token_id or 0
    timed = []
    for model in trainees:
        started = time.perf_counter()
        timed.append((PolicyTrainer(model, TrainerConfig(), pad_id=pad).train_step(0, batch),
                      time.perf_counter() - started))
    (cpu_report, cpu_s), (there_report, there_s) = timed
    weights = max(float((a.detach().cpu() - b.detach().cpu()).abs().max())
                  for a, b in zip(*(model.parameters() for model in trainees)))
    loss_gap = abs(cpu_report.loss - there_report.loss)
    norm_gap = abs(cpu_report.grad_norm - there_report.grad_norm) / max(cpu_report.grad_norm, 1e-12)
    close = loss_gap < 1e-3 and norm_gap < 1e-2 and weights < 1e-3
    return {"loss_cpu": cpu_report.loss, "loss_device": there_report.loss, "grad_norm_relative_gap": norm_gap,
            "weights_max_abs_difference": weights, "cpu_s": round(cpu_s, 3), "device_s": round(there_s, 3),
            "skipped": there_report.skipped, "ok": not there_report.skipped and (weights == 0.0 if exact else close)}
