"""`swarm train`: the single-machine RL loop (no network): generate, score, GRPO, publish, checkpoint.

Writes into --out: log.jsonl (one line per step), eval.jsonl (held-out accuracy), reward.png, checkpoints/,
policies/ (the async window's versions) and final/ (the last policy, loadable with `--model OUT/final`).
Re-running with the same --out resumes the run there from its newest checkpoint that verifies (naming each one
skipped), saying "resuming OUT from step N"; an --out holding a run of another model, task or config is refused
unless --resume is given, and --resume-from PATH picks the checkpoint. With --async-level > 0 the generator runs in its
own process by default (--generator thread for the older in-process thread). `--compare SYNC_DIR ASYNC_DIR ...`
trains nothing: it writes the runs' reward-against-wall-time curves to --out/compare.json and compare.png (a
directory of seed runs counts as one curve, their mean). `--nproc N` trains data parallel on N local ranks under
torchrun (trainer.launch).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from swarm.errors import usable_directory
from swarm.log_lines import say
from trainer.config import PARALLEL_MODES, TrainerConfig, load_config
from trainer.errors import TrainerError
from trainer.report import compare_groups, compare_runs, plot_comparison, read_log
from trainer.typed_config import add_field_flag, add_set_flag


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", type=Path, help="trainer TOML file (flags and --set override it)")
    for field in OWN_FLAGS:
        add_field_flag(parser, TrainerConfig, field, **_CHOICES.get(field, {}))
    parser.add_argument("--resume", action="store_const", const=True,
                        help="continue the run in --out even if it was started with another model, task or config "
                             "(it must hold a checkpoint)")
    add_set_flag(parser, "trainer.lr=1e-4")
    parser.add_argument("--nproc", type=int, default=1,
                        help="data-parallel trainer processes on this machine (torchrun; gloo on CPUs, nccl on GPUs); "
                             "rank 0 generates, every rank trains on its share of each batch")
    parser.add_argument("--quiet", action="store_true", help="no per-step progress lines")
    add_report_to(parser)
    parser.add_argument("--compare", type=Path, nargs="+", metavar="RUN_DIR",
                        help="train nothing: compare the reward-vs-wall-time curves of finished runs (sync first) "
                             "into --out/compare.json and compare.png; a directory of runs (one per seed) is "
                             "compared by its seed-mean curve")
    parser.add_argument("--reach", type=float,
                        help="with --compare: the 5-step mean reward to reach (default: the first run's final)")


OWN_FLAGS = ("model", "task", "prompt_key", "answer_key", "async_level", "curriculum", "steps", "out", "seed", "lr",
             "group_size", "prompts_per_step", "max_new_tokens", "temperature", "eval_every", "eval_n", "threads",
             "generator", "generator_threads", "time_limit_min", "old_logprobs", "off_policy_loss", "parallel",
             "device", "resume_from", "keep_last")
"""The fields with a flag of their own (`--async-level`); every field is also `--set trainer.FIELD=VALUE`."""

_CHOICES = {"generator": {"choices": ("process", "thread")}, "old_logprobs": {"choices": ("recompute", "generator")},
            "off_policy_loss": {"choices": ("coupled", "decoupled")}, "parallel": {"choices": PARALLEL_MODES},
            "device": {"choices": ("auto", "cpu", "cuda")}, "resume_from": {"metavar": "PATH"}}


def run(args: argparse.Namespace) -> int:
    if args.compare:
        return _compare(args)
    from trainer.launch import check_supported, launch_ranks, world_size
    from trainer.session import train

    overrides = {k: getattr(args, k, None) for k in (*OWN_FLAGS, "resume")}
    overrides["report_to"] = ",".join(args.report_to) if args.report_to else None
    if overrides.get("out") is not None:
        overrides["out"] = str(overrides["out"])
    loaded = load_config(args.config, overrides, args.set)  # a bad config is one line here, not one per rank
    if args.nproc < 1:
        raise TrainerError(f"--nproc must be at least 1, got {args.nproc}")
    if loaded.config.parallel == "fsdp" and max(args.nproc, world_size()) == 1:
        raise TrainerError("parallel = fsdp shards the trainer over data-parallel ranks: give --nproc 2 or more")
    out = Path(loaded.config.out)
    created = missing_directories(out)
    usable_directory(out, "output directory")
    try:
        if args.nproc > 1 and world_size() == 1:
            check_supported(loaded.config)
            return launch_ranks(args.nproc, args._argv)
        echo = (lambda line: None) if args.quiet else say
        summary = train(loaded.config, loaded.curriculum, echo=echo)
    except Exception as exc:
        if getattr(exc, "user_facing", False):
            remove_if_empty(created)
        raise
    if "rank" not in summary:  # with --nproc, rank 0 alone reports
        print(json.dumps(summary))
    return 0


def add_report_to(parser: argparse.ArgumentParser, prefix: str = "") -> None:
    """`--report-to`, shared by the commands that train (train, peer start, sim)."""
    parser.add_argument("--report-to", dest="report_to", action="append", metavar="TRACKER",
                        help=f"{prefix}experiment tracking of every step: tensorboard, wandb (offline unless "
                             "WANDB_MODE is set) or none; repeatable or comma-separated; files under the output "
                             "directory (default: none)")


def missing_directories(path: Path) -> list[Path]:
    """`path` and each of its ancestors that do not exist yet, deepest first: what creating `path` creates."""
    missing = []
    for candidate in (path, *path.parents):
        if candidate.exists():
            break
        missing.append(candidate)
    return missing


def remove_if_empty(directories: list[Path]) -> None:
    """Take back the directories a refused run created (deepest first), each only while it is still empty: the
    refusal (an unknown task, a model or a GPU that is not there) comes after --out exists, and a refused command
    leaves nothing behind, but never at the cost of a file some step already wrote."""
    for directory in directories:
        try:
            directory.rmdir()
        except OSError:
            return


def _compare(args: argparse.Namespace) -> int:
    logs = {str(directory): _compared_logs(directory) for directory in args.compare}
    out = args.out or Path("runs/compare")
    out.mkdir(parents=True, exist_ok=True)
    if all(len(runs) == 1 for runs in logs.values()):
        result = compare_runs({label: runs[0] for label, runs in logs.items()}, args.reach)
    else:
        result = compare_groups(logs, args.reach)
    (out / "compare.json").write_text(json.dumps(result, indent=1) + "\n")
    plot = plot_comparison(result, out / "compare.png", "reward against wall time")
    summary = {label: {k: v for k, v in run.items() if k != "curve"} for label, run in result["runs"].items()}
    print(json.dumps({"threshold": result["threshold"], "runs": summary, "json": str(out / "compare.json"),
                      "plot": str(plot) if plot else None}))
    return 0


def _compared_logs(directory: Path) -> list[list[dict]]:
    """One run's log, or, for a directory of runs (one per seed), each of their logs."""

    log = read_log(directory / "log.jsonl")
    if log:
        return [log]
    seeds = [read_log(child / "log.jsonl") for child in sorted(directory.iterdir())] if directory.is_dir() else []
    seeds = [log for log in seeds if log]
    if not seeds:
        raise TrainerError(f"{directory} holds no log.jsonl with training steps, nor runs that do")
    return seeds
