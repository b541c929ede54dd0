"""`swarm bench patch`: what a policy step costs as a patch, on real RL steps, and what that saves the swarm.

Per learning rate, real GRPO steps of the config's model (`swarm train`'s machinery: TrainingRun and the local
rollout source, synchronous, in this process) publish one bf16 version each; every consecutive pair is encoded as a
patch (p2p.pieces.patch), applied to the parent and checked against every tensor's hash, and the rebuilt file is
compared byte for byte with the trainer's. It reports per step the changed fraction of elements, the patch's bytes
against a bf16 copy and against a float32 copy, the time to encode and to apply and verify, and whether the rebuild
was bit-identical. Then (swarm.bench.patch_swarm) the versions are broadcast to peers at a capped upload, patches
against full copies, and a peer missing its parent catches up through the real mirror. Last, the gap between the
trainer's and the workers' logprobs: the workers sample with the bf16 weights; the trainer's old logprobs come from
the same rounded weights, and the figure beside them is what its float32 weights would have given.
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time
from pathlib import Path

from p2p.pieces.manifest import tensor_digest
from p2p.pieces.patch import apply_patch, encode_patch, tensor_index
from swarm.bench.patch_swarm import broadcast_costs, catch_up_bytes
from swarm.errors import UserError
from trainer.config import load_config

DEFAULT_CONFIG = "trainer/configs/smollm2_addsub.toml"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", default=DEFAULT_CONFIG, help=f"trainer TOML (default {DEFAULT_CONFIG})")
    parser.add_argument("--lrs", default="1e-6,3e-6,2e-5", help="learning rates, comma-separated")
    parser.add_argument("--steps", type=int, default=3, help="RL steps (versions after the first) per learning rate")
    parser.add_argument("--prompts", type=int, default=0, help="prompts per step (default: the config's)")
    parser.add_argument("--peers", type=int, default=8, help="peers of the broadcast (default 8)")
    parser.add_argument("--upload-mbps", dest="upload_mbps", type=float, default=32.0,
                        help="upload cap of the seed and of every peer in the broadcast, Mbit/s (default 32)")
    parser.add_argument("--json", action="store_true", help="print the JSON report on one line")


def run(args: argparse.Namespace) -> int:
    lrs = [float(x) for x in args.lrs.split(",") if x.strip()]
    if not lrs or args.steps < 1 or args.peers < 1 or args.upload_mbps <= 0:
        raise UserError("a patch benchmark needs a learning rate, at least one step and peer, and a positive cap")
    report: dict = {"config": args.config, "runs": []}
    with tempfile.TemporaryDirectory(prefix="bench-patch-") as scratch:
        for lr in lrs:
            versions, gap = train_versions(args, lr, Path(scratch) / f"lr-{lr:g}")
            steps = [measure_step(versions[i - 1], versions[i], Path(scratch) / f"apply-{lr:g}-{i}")
                     for i in range(1, len(versions))]
            record = {"lr": lr, "steps": steps, "logprob_gap": gap}
            if lr == lrs[-1] or len(lrs) == 1:
                record["swarm"] = broadcast_costs(versions, args.peers, args.upload_mbps * 1e6 / 8,
                                                  Path(scratch) / "broadcast")
                record["catch_up"] = catch_up_bytes(versions, Path(scratch) / "catch-up")
            report["runs"].append(record)
            if not args.json:
                print(json.dumps(record, indent=2), flush=True)
    report["mismatched_rebuilds"] = sum(not s["bit_identical"] for r in report["runs"] for s in r["steps"])
    print(json.dumps(report, indent=None if args.json else 2))
    return 1 if report["mismatched_rebuilds"] else 0


def train_versions(args: argparse.Namespace, lr: float, out: Path) -> tuple[list[Path], dict]:
    """Real GRPO steps at `lr`, one bf16 version each; returns each version's weights file, oldest first, and the
    logprob gap measured on the last version."""
    from inference.models import load_model
    from swarm.bench.patch_logprobs import logprob_gap
    from trainer.local_source import LocalRolloutSource
    from trainer.loop import TrainingRun, run_sync
    from trainer.session_setup import load_task_split

    overrides = {"lr": lr, "out": str(out), "steps": args.steps, "async_level": 0, "steps_per_policy": 1,
                 "warmup_steps": 0, "eval_every": 0, "checkpoint_every": 10_000, "publish_dtype": "bfloat16",
                 "prompts_per_step": args.prompts or None, "time_limit_min": 0}
    loaded_cfg = load_config(Path(args.config), overrides=overrides)
    cfg = loaded_cfg.config
    train_set, _ = load_task_split(cfg)
    run = TrainingRun(load_model(cfg.model), cfg, loaded_cfg.curriculum)
    source = LocalRolloutSource.for_config(cfg, train_set)
    kept: list[Path] = []

    def keep_newest() -> None:
        policy = run.latest_policy()
        target = out / "kept" / f"v{policy.version}.safetensors"
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(policy.path / "model.safetensors", target)
        kept.append(target)

    keep_newest()
    run_sync(run, source, args.steps, keep_newest)
    return kept, logprob_gap(run, source)


def measure_step(parent: Path, child: Path, work: Path) -> dict:
    """One version as a patch over its parent: sizes, times and whether the rebuild is the trainer's file."""
    work.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    stats = encode_patch([parent], [child], work / "model.patch")
    encoded = time.perf_counter() - started
    index = tensor_index([child])
    expected = {name: (child.name, spot, tensor_digest(path, spot.start, spot.nbytes))
                for name, (path, spot) in index.items()}
    (work / "out").mkdir()
    started = time.perf_counter()
    [rebuilt] = apply_patch((work / "model.patch").read_bytes(), [parent], work / "out", expected)
    applied = time.perf_counter() - started
    bf16_bytes = child.stat().st_size
    data = sum(spot.nbytes for _, spot in index.values())
    float32_bytes = bf16_bytes + data  # the same header, every published (bf16) element in four bytes
    identical = rebuilt.read_bytes() == child.read_bytes()
    shutil.rmtree(work, ignore_errors=True)
    return {"changed_fraction": round(stats.changed / stats.elements, 5), "patch_bytes": stats.bytes,
            "bf16_bytes": bf16_bytes, "float32_bytes": float32_bytes,
            "x_fewer_than_bf16": round(bf16_bytes / stats.bytes, 1),
            "x_fewer_than_float32": round(float32_bytes / stats.bytes, 1),
            "encode_s": round(encoded, 3), "apply_and_verify_s": round(applied, 3), "bit_identical": identical}
