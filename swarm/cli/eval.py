"""`swarm eval`: a policy's accuracy on held-out prompts (greedy by default, batched).

The held-out prompts are the same split `swarm train` sets aside for the same --task, --seed, --size and
--eval-fraction, so a policy is never scored on a prompt it was trained on. With --config the model, task, task
settings, seed, size, held-out share and generation limit are the trainer TOML's (each flag given overrides its
value), so a policy is scored as its trainer scored it. Without --config, a swarm policy's directory gives its run's
task settings (its model.json's run spec); otherwise the defaults are used and one line on stderr says which
(--json: the `task_settings` field). On a terminal, bars on stderr show the model's conversion
and loading and the prompts scored (swarm.progress); --json and pipes get none.

--lenient adds two readings of each completion's number besides the task's reward (trainer/answer_readings.py):
whether its last number is the answer, and whether any of its numbers is. With a generous --max-new-tokens (96 for
a trainer limit of 24) they tell a policy that has learned to state its answer sooner from one that has learned to
compute it. --per-prompt keeps every prompt's completion and verdicts, and --compare BEFORE AFTER reads two such
files back as paired differences with 95 % intervals over the prompts (swarm/cli/eval_compare.py).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from swarm.cli.eval_compare import compare
from swarm.errors import UserError, require_at_least_one, require_temperature
from swarm.progress import bar_console, progress_bars
from trainer.answer_readings import PromptOutcome, reading_accuracy
from trainer.config import TrainerConfig, load_config
from trainer.typed_config import add_set_flag

DEFAULT_MAX_NEW_TOKENS = 64
"""The generation limit without a --config: room for a short answer and the words around it."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", help="tiny, smollm2, a policy directory (e.g. OUT/final) or a cached Hugging Face "
                                         "hub id (default: the config's, else tiny)")
    parser.add_argument("--task", help="reasoning-gym task name, .jsonl/.json/.parquet/.csv file or cached hub dataset "
                                       "ORG/NAME (default: the config's, else the trainer's default, gcd)")
    parser.add_argument("--prompt-key", dest="prompt_key", help="task file column holding the prompt (default: the "
                                                                "config's, else prompt)")
    parser.add_argument("--answer-key", dest="answer_key", help="task file column holding the answer (default: the "
                                                                "config's, else answer)")
    parser.add_argument("--n", type=int, default=200, help="held-out prompts to score")
    parser.add_argument("--seed", type=int, help="seed of the task set and its held-out split (default: the "
                                                 "config's, else 0)")
    parser.add_argument("--size", type=int, default=None, help="task set size (default: the trainer's task_size)")
    parser.add_argument("--eval-fraction", type=float, default=None, dest="eval_fraction",
                        help="held-out share (default: the trainer's)")
    parser.add_argument("--config", default=None,
                        help="trainer TOML whose model, task, task_config, seed, task_size and eval_fraction to reuse")
    add_set_flag(parser, "trainer.task_config={max_value=50}")
    parser.add_argument("--max-new-tokens", type=int, dest="max_new_tokens",
                        help=f"generation limit (default: the config's, so a policy is scored as its trainer scored "
                             f"it, else {DEFAULT_MAX_NEW_TOKENS})")
    parser.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    parser.add_argument("--batch", type=int, default=32, help="prompts per generate call")
    parser.add_argument("--json", action="store_true", help="print one JSON line (default: a sentence)")
    parser.add_argument("--lenient", action="store_true",
                        help="also report the share of completions whose last number is the answer and the share "
                             "that state it anywhere (use with a generous --max-new-tokens, e.g. 96)")
    parser.add_argument("--per-prompt", type=Path, dest="per_prompt", metavar="PATH",
                        help="write one JSON line per prompt: index, answer, completion, reward and each reading")
    parser.add_argument("--compare", type=Path, nargs=2, metavar=("BEFORE", "AFTER"),
                        help="score nothing: paired differences AFTER - BEFORE of two --per-prompt files, per "
                             "reading, with 95 %% bootstrap intervals over their prompts")


def run(args: argparse.Namespace) -> int:
    if args.compare:
        return compare(*args.compare, args.json)
    require_at_least_one(n=args.n, batch=args.batch)
    if args.max_new_tokens is not None:
        require_at_least_one(max_new_tokens=args.max_new_tokens)
    require_temperature(args.temperature)

    from inference.models import check_model_spec, load_model
    from trainer.evaluate import evaluate
    from trainer.session import load_task_split
    overrides = {"model": args.model, "task": args.task, "seed": args.seed, "task_size": args.size,
                 "eval_fraction": args.eval_fraction, "prompt_key": args.prompt_key, "answer_key": args.answer_key}
    run_settings = {} if args.config else _policy_run_settings(args.model)
    free = {key: value for key, value in run_settings.items() if overrides.get(key) is None
            and not any(text.split("=", 1)[0].strip() == f"trainer.{key}" for text in args.set)}
    cfg = load_config(args.config, {**overrides, **free}, args.set).config  # flags given override the config's
    check_model_spec(cfg.model)  # before the task set is built: a missing model is one line at once
    settings_from = "config" if args.config else "policy's run" if free else "defaults"
    max_new_tokens = args.max_new_tokens
    if max_new_tokens is None:
        max_new_tokens = cfg.max_new_tokens if args.config else DEFAULT_MAX_NEW_TOKENS
    _, heldout = load_task_split(cfg)  # a task that does not load is one line, with no settings line before it
    if settings_from != "config" and not args.json:
        print(_settings_line(cfg, bool(free)), file=sys.stderr)
    with progress_bars(bar_console(args.json)) as bars:
        model_bar = bars.bar(f"model {cfg.model}")
        loaded = load_model(cfg.model, on_step=model_bar.step)
        model_bar.finish()
        started = time.perf_counter()
        eval_bar = bars.bar(f"scoring held-out prompts of {cfg.task}")
        result = evaluate(loaded, heldout, n=args.n, seed=cfg.seed, max_new_tokens=max_new_tokens,
                          temperature=args.temperature, batch=args.batch, on_progress=eval_bar.update)
    out = {"model": cfg.model, "task": cfg.task, "accuracy": result.accuracy, "mean_reward": result.mean_reward,
           "n": result.n, "mean_tokens": result.mean_tokens, "temperature": args.temperature, "seed": cfg.seed,
           "max_new_tokens": max_new_tokens, "seconds": round(time.perf_counter() - started, 1),
           "task_settings": settings_from}
    if args.lenient:
        out.update(_lenient_figures(result.outcomes))
    if args.per_prompt:
        _write_per_prompt(args.per_prompt, result.outcomes)
    print(json.dumps(out) if args.json else _sentence(out, cfg))
    return 0


def _lenient_figures(outcomes: tuple[PromptOutcome, ...]) -> dict:
    return {"last_number_accuracy": reading_accuracy(outcomes, "last_number"),
            "any_number_accuracy": reading_accuracy(outcomes, "any_number")}


def _write_per_prompt(path: Path, outcomes: tuple[PromptOutcome, ...]) -> None:
    try:
        path.write_text("".join(json.dumps(o.to_dict()) + "\n" for o in outcomes))
    except OSError as exc:
        raise UserError(f"cannot write per-prompt file {path}: {exc.strerror or exc}") from None


def _sentence(out: dict, cfg: TrainerConfig) -> str:
    line = f"accuracy {out['accuracy']:.3f} on {out['n']} held-out prompts of {cfg.task} ({cfg.model})"
    if "last_number_accuracy" in out:
        line += (f"; within {out['max_new_tokens']} tokens the last number is the answer in "
                 f"{out['last_number_accuracy']:.3f}, any number in {out['any_number_accuracy']:.3f}")
    return line


def _policy_run_settings(model: str | None) -> dict:
    """The task settings of the run a swarm policy directory was published in (its model.json's run spec), as
    trainer config fields; {} for anything else (a `swarm train` policy names no run settings)."""
    from swarm.policy.runspec import RunSpec

    directory = Path(model) if model else None
    try:
        spec = RunSpec.from_model(json.loads((directory / "model.json").read_text()))
    except (TypeError, OSError, ValueError, UserError):
        return {}
    settings = {"task": str(directory / spec.task) if spec.task_root else spec.task, "task_size": spec.task_size,
                "task_config": json.loads(spec.task_config), "seed": spec.task_seed,
                "eval_fraction": spec.eval_fraction}
    if spec.reward:
        if spec.reward_problem():  # scoring with other code than the run's would report another accuracy
            raise UserError(f"the policy's run scores with its own reward: {spec.reward_problem()}")
        settings["reward"] = spec.reward
    return settings


def _settings_line(cfg: TrainerConfig, from_policy: bool) -> str:
    """Where the task settings of an evaluation without --config come from, said once, since scoring a policy on
    another split or difficulty than its run's reads as a wrong accuracy."""
    settings = f"task {cfg.task}, seed {cfg.seed}, task_size {cfg.task_size}, eval_fraction {cfg.eval_fraction}"
    if from_policy:
        return f"task settings of the policy's own run: {settings}"
    return (f"default task settings, not necessarily the run's: {settings}; give --config with the run's trainer "
            f"TOML to score the policy as its trainer did")
