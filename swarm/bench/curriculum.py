"""`swarm bench curriculum`: FastCuRL's schedule against a fixed context at one budget of generated tokens.

Why a token budget and not a step count: a short-context stage costs fewer tokens per step, so equal steps would
favour neither schedule fairly (docs/reference.md#fastcurl). Each arm plans its stage lengths so that, at worst
(every completion running to its stage's limit), its steps fit the budget (trainer.curriculum.steps_within_budget),
then trains until the next step could overrun it. Every seed is one sampling-noise draw (the run name keys the
prompt assignment and the Gumbel sampling); the task set, its held-out split and the model's initial weights are
the same in every run, so the two arms of one seed are paired. It is `swarm train`'s own machinery (TrainingRun,
LocalRolloutSource, trainer.evaluate), synchronous, in this process, with no network.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
import tomllib
from pathlib import Path

from swarm.bench.curriculum_stats import paired_difference, summarize_arm
from swarm.errors import UserError
from trainer.config import load_config
from trainer.curriculum import step_token_bound, steps_within_budget

ARMS = ("fastcurl", "none")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--seeds", type=int, default=8, help="sampling-noise draws per arm (default 8)")
    parser.add_argument("--arms", default=",".join(ARMS), help="curricula to compare, comma-separated "
                        "(presets or [[stage]] TOML files; default fastcurl,none)")
    parser.add_argument("--model", default="tiny", help="tiny, smollm2 or a local HF directory")
    parser.add_argument("--task", default="gcd", help="reasoning-gym task or .jsonl/.parquet file (default gcd)")
    parser.add_argument("--task-config", dest="task_config", default="{max_value = 50}",
                        help="TOML inline table of difficulty settings (default {max_value = 50}: the operands "
                             "have one or two digits, so prompt and answer lengths vary together)")
    parser.add_argument("--task-size", dest="task_size", type=int, default=400)
    parser.add_argument("--token-budget", dest="token_budget", type=int, default=8192,
                        help="generated tokens per run (default 8192: about 16 fixed-context steps)")
    parser.add_argument("--max-new-tokens", dest="max_new_tokens", type=int, default=8,
                        help="the fixed arm's context and FastCuRL's middle one (default 8)")
    parser.add_argument("--group-size", dest="group_size", type=int, default=16)
    parser.add_argument("--prompts-per-step", dest="prompts_per_step", type=int, default=4)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--target", type=float, default=0.25, help="training reward to reach (default 0.25)")
    parser.add_argument("--window", type=int, default=3, help="steps the target reward is averaged over")
    parser.add_argument("--eval-n", dest="eval_n", type=int, default=64, help="held-out prompts evaluated")
    parser.add_argument("--threads", type=int, default=1, help="torch threads")
    parser.add_argument("--json", action="store_true", help="print the report as one JSON object")


def run(args: argparse.Namespace) -> int:
    arms = [a.strip() for a in args.arms.split(",") if a.strip()]
    if args.seeds < 1 or args.token_budget < 1 or args.window < 1 or not arms:
        raise UserError("a curriculum benchmark needs at least one seed, one arm, a positive budget and window")
    task_config = _task_config(args.task_config)
    started = time.monotonic()
    runs: dict[str, list[dict]] = {arm: [] for arm in arms}
    with tempfile.TemporaryDirectory(prefix="bench-curriculum-") as scratch:
        for seed in range(args.seeds):
            for arm in arms:
                record = train_arm(args, arm, seed, task_config, Path(scratch) / f"{Path(arm).stem}-{seed}")
                runs[arm].append(record)
                if not args.json:
                    print(f"{arm} seed {seed}: {len(record['rewards'])} steps, {sum(record['tokens'])} tokens, "
                          f"held-out {record['heldout_after']:.3f}, final reward {record['final_reward']:.3f}",
                          flush=True)
    report = {
        "model": args.model, "task": args.task, "task_config": task_config, "token_budget": args.token_budget,
        "max_new_tokens": args.max_new_tokens, "group_size": args.group_size,
        "prompts_per_step": args.prompts_per_step, "lr": args.lr, "target": args.target, "window": args.window,
        "eval_n": args.eval_n, "wall_s": round(time.monotonic() - started, 1),
        "arms": {arm: summarize_arm(runs[arm], target=args.target, window=args.window) for arm in arms},
        "runs": runs,
    }
    if len(arms) == 2:
        first, second = arms
        report[f"{first}_minus_{second}"] = {
            key: paired_difference(runs[first], runs[second], key) for key in ("heldout_after", "final_reward")}
    print(json.dumps(report) if args.json else _render(report), flush=True)
    return 0


def _task_config(text: str) -> dict:
    try:
        return tomllib.loads(f"config = {text}")["config"]
    except (tomllib.TOMLDecodeError, KeyError):
        raise UserError(f"--task-config {text!r} is not a TOML inline table such as {{max_value = 50}}") from None


def train_arm(args: argparse.Namespace, arm: str, seed: int, task_config: dict, out: Path) -> dict:
    """One run of one arm: train synchronously until the next step could overrun the budget; evaluate once."""
    import torch

    from inference.models import load_model
    from trainer.evaluate import evaluate
    from trainer.local_source import LocalRolloutSource
    from trainer.loop import TrainingRun
    from trainer.session import load_task_split, seed_everything

    planned = steps_within_budget(arm, args.token_budget, max_new_tokens=args.max_new_tokens,
                                  group_size=args.group_size, prompts_per_step=args.prompts_per_step)
    loaded = load_config(None, {
        "model": args.model, "task": args.task, "task_config": task_config, "task_size": args.task_size,
        "curriculum": arm, "run": f"bench-curriculum-{seed}", "seed": 0, "steps": planned, "lr": args.lr,
        "temperature": args.temperature, "max_new_tokens": args.max_new_tokens, "group_size": args.group_size,
        "prompts_per_step": args.prompts_per_step, "steps_per_policy": 1, "async_level": 0, "grad_clip": 1.0,
        "checkpoint_every": 1_000_000, "eval_n": args.eval_n, "threads": args.threads, "out": out})
    cfg, curriculum = loaded.config, loaded.curriculum
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    seed_everything(cfg.seed)
    train_set, heldout = load_task_split(cfg)
    trainer_model = load_model(cfg.model)
    run = TrainingRun(trainer_model, cfg, curriculum)
    source = LocalRolloutSource.from_loaded(cfg, load_model(cfg.model), train_set)
    rewards, tokens = [], []
    while sum(tokens) + step_token_bound(curriculum, run.state.step, cfg.prompts_per_step) <= args.token_budget:
        record = run.step(source.generate(run.state.step, run.latest_policy()))
        rewards.append(float(record.reward or 0.0))  # a step that trained no group reports none
        tokens.append(int(record.generated_tokens))
    with torch.no_grad():  # the same context for both arms: the fixed arm's, FastCuRL's middle and last stage's
        result = evaluate(trainer_model, heldout, n=cfg.eval_n, seed=cfg.seed, max_new_tokens=cfg.max_new_tokens)
    tail = rewards[-max(1, args.window):]
    return {"seed": seed, "arm": arm, "planned_steps": planned, "rewards": [round(r, 4) for r in rewards],
            "tokens": tokens, "last_stage": curriculum.stage_at(max(0, len(rewards) - 1)).stage.name,
            "heldout_after": result.accuracy, "final_reward": sum(tail) / len(tail) if tail else 0.0}


def _render(report: dict) -> str:
    lines = [f"curriculum benchmark: {report['model']} on {report['task']} {report['task_config']}, "
             f"{report['token_budget']} generated tokens per run, target reward {report['target']} "
             f"(mean of {report['window']} steps), {report['wall_s']} s"]
    for arm, figures in report["arms"].items():
        lines.append(f"  {arm}: reached {figures['reached_target']}/{figures['seeds']}, "
                     f"steps to target {_fmt(figures['steps_to_target'])}, "
                     f"tokens to target {_fmt(figures['tokens_to_target'])}, "
                     f"held-out {_fmt(figures['heldout_accuracy'])}, final reward {_fmt(figures['final_reward'])}")
    for key, value in report.items():
        if "_minus_" in key:
            lines.append(f"  {key}: held-out {_fmt(value['heldout_after'])}, final reward "
                         f"{_fmt(value['final_reward'])}")
    return "\n".join(lines)


def _fmt(interval: dict) -> str:
    low, high = interval["ci95"]
    return f"{interval['mean']:.3g} [{low:.3g}, {high:.3g}]"
