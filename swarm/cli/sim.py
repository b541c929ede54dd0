"""`swarm sim`: simulate a whole swarm locally (see swarm/sim/run.py). Defaults finish in a few minutes on 2 cores."""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

from swarm.cli.peer import add_metrics_port
from swarm.cli.train import add_report_to
from swarm.errors import UserError, usable_directory
from swarm.event_types import (
    Complete,
    DhtFound,
    Evaluated,
    Generated,
    Listening,
    MetricsListening,
    Published,
    RejectedRollout,
    RoleFailed,
    Stalled,
    TrainerWaiting,
    TrainStep,
    WorkerBanned,
)
from swarm.events import Emitted, EventSink
from swarm.node.gc_warmup import run_freezing_after_warmup
from swarm.node.metrics import check_port_free
from swarm.readable import readable_counts
from swarm.shutdown import HARD_EXIT_AFTER_S, ExitGuard, run_trio
from tasks.loading import check_builtin_name, is_builtin_task, load_tasks
from trainer.config import load_config
from trainer.curriculum import PRESETS
from trainer.errors import TrainerError
from trainer.tracking import parse_report_to

SIM_ASYNC_LEVEL = 1
"""The one trainer default the simulation overrides (the trainer's own is 0, synchronous): a swarm's point is that
workers generate the next version's rollouts while the trainer steps, and the simulation shows that window."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", type=Path, default=Path("runs/sim"), help="where peers keep data and the report")
    parser.add_argument("--inference", type=int, default=2, help="honest inference peers")
    parser.add_argument("--validators", type=int, default=2, help="validator peers")
    parser.add_argument("--seed-peers", dest="seeds", type=int, default=1, help="seed-only peers")
    parser.add_argument("--seeds", dest="seeds", type=int, default=1, help=argparse.SUPPRESS)
    parser.add_argument("--cheaters", type=int, default=1, help="inference peers that claim reward 1.0 (rejected)")
    parser.add_argument("--config", type=Path,
                        help="a trainer TOML (as `swarm train --config`): the model, task, batch sizes, learning "
                             "rate and curriculum come from it (so --model, --task, --curriculum, --prompt-key and "
                             "--answer-key are not given with it); --steps, --eval-every and --time-limit-min "
                             "override it")
    parser.add_argument("--steps", type=int, help="trainer steps, one policy version each; with --config, the "
                                                  f"config's steps (default: {SIM_DEFAULTS['steps']})")
    parser.add_argument("--time-limit-min", dest="time_limit_min", type=float, default=0.0,
                        help="the trainer stops stepping after this many minutes (0: only --steps stops it); the "
                             "final evaluation still follows")
    parser.add_argument("--curriculum",
                        help="fastcurl (4 stages over the steps, the default), none (one context) or a TOML file "
                        "of [[stage]] tables")
    parser.add_argument("--model", help="tiny-sum (the default), tiny, smollm2, a local HF directory or a cached hub "
                        "id")
    parser.add_argument(
        "--task",
        help="reasoning-gym task, a .jsonl/.json/.parquet/.csv task file or a cached hub dataset ORG/NAME (the "
        "trainer reads it; the other peers receive it with every policy); default: chain_sum, here sums and "
        "differences of two one-digit numbers, tiny-sum's task",
    )
    parser.add_argument("--prompt-key", dest="prompt_key", help="task file column of the prompt (default: prompt)")
    parser.add_argument("--answer-key", dest="answer_key", help="task file column of the answer (default: answer)")
    parser.add_argument("--async-level", dest="async_level", type=int, default=SIM_ASYNC_LEVEL,
                        help="max policy lag of a rollout (the trainer's default is 0; the simulation shows the "
                             "swarm's asynchronous window, where workers generate while the trainer steps)")
    parser.add_argument("--eval-every", dest="eval_every", type=int,
                        help="steps between the trainer's held-out evaluations, 0 = only before and after; with "
                             f"--config, the config's (default: {SIM_DEFAULTS['eval_every']})")
    parser.add_argument("--timeout", type=float,
                        help="seconds before the simulation is stopped; with --time-limit-min, 15 minutes past it "
                             "(default: 900)")
    parser.add_argument("--json", action="store_true", help="print JSON event lines and the JSON report")
    add_report_to(parser)
    add_metrics_port(parser, "each peer's (the trainer on PORT, the next peers on PORT+1, PORT+2, ...)")


def run(args: argparse.Namespace) -> int:
    from swarm.sim.run import run_sim, summarize, write_report

    parse_report_to(args.report_to or ())  # an unknown tracker is one line before any peer starts
    _check_metrics_ports(args)
    settings = _settings(args)
    _clear_previous_run(args.out)  # a simulation always starts a fresh run
    events: list[Emitted] = []
    sink = EventSink(json_lines=args.json, stream=sys.stdout if args.json else open("/dev/null", "w"))
    sink.listeners.append(events.append)
    if not args.json:
        sink.listeners.append(_narrate)
    sink.configure_logging()

    def finish(extra: dict) -> int:
        report = summarize(events, extra)
        write_report(args.out, report, events)
        print(json.dumps(report) if args.json else _render(report, args.out), flush=True)
        return 1 if extra["timed_out"] or any(isinstance(e.event, RoleFailed) for e in events) else 0

    stopped: dict = {}
    guard = ExitGuard(HARD_EXIT_AFTER_S, before_exit=lambda: finish(stopped))

    def stopping(extra: dict) -> None:  # the work is done: from here on only the peers' network closes
        stopped.update(extra)
        guard.arm(0)

    extra = run_trio(run_freezing_after_warmup, run_sim, settings, sink, stopping)
    guard.disarm()
    return finish(extra)


SIM_DEFAULTS = {"model": "tiny-sum", "task": "chain_sum", "curriculum": "fastcurl",
                "prompt_key": "prompt", "answer_key": "answer", "steps": 16, "eval_every": 4}
"""What a simulation without --config runs: tiny-sum (inference.tiny_sum) unlearning its habit of answering one
too high on one-digit sums and differences, FastCuRL over 16 steps, held-out accuracy every 4."""

SIM_TASK_CONFIGS = {"chain_sum": "{min_terms = 2, max_terms = 2, min_digits = 1, max_digits = 1, scorer = \"numeric\"}",
                    "gcd": "{max_value = 50}"}
"""A built-in task's difficulty in a simulation: tiny-sum's own task as it was taught, gcd small enough for tiny."""

SIM_LEARNING_RATES = {"tiny-sum": 5e-4}
"""A model's learning rate in a simulation where it differs from the trainer's default: at tiny-sum's 1e-3 one
seed in three barely moved, and at 3e-3 every policy collapsed (docs/benchmarks.md)."""

TRAINER_FLAGS = ("model", "task", "curriculum", "prompt_key", "answer_key")
"""The flags a --config file sets instead: given beside it, one of the two would silently lose."""


def _settings(args: argparse.Namespace):
    """The simulation's settings from the flags, or from a trainer TOML (--config) and the flags that size the
    swarm; every problem is one line before any peer starts."""
    from inference.models import check_model_spec
    from swarm.sim.run import SimSettings

    too_few_steps = args.steps is not None and args.steps < 1
    if min(args.inference, args.validators) < 1 or min(args.seeds, args.cheaters) < 0 or too_few_steps:
        raise UserError("a simulation needs at least one inference peer, one validator and one step")
    if args.eval_every is not None and args.eval_every < 0:
        raise UserError(f"--eval-every must be 0 or more steps, got {args.eval_every}")
    if not args.time_limit_min >= 0:  # NaN fails too
        raise UserError(f"--time-limit-min must be 0 or more minutes, got {args.time_limit_min}")
    common = dict(out=args.out, inference=args.inference, validators=args.validators, seeds=args.seeds,
                  cheaters=args.cheaters, async_level=args.async_level, time_limit_min=args.time_limit_min,
                  timeout_s=900.0 + 60.0 * args.time_limit_min if args.timeout is None else args.timeout,
                  report_to=",".join(args.report_to or ["none"]), metrics_port=args.metrics_port or 0)
    if args.config is not None:
        return SimSettings(**common, **_from_trainer_config(args))
    chosen = {name: default if getattr(args, name) is None else getattr(args, name)
              for name, default in SIM_DEFAULTS.items()}
    _check_task(chosen["task"], chosen["prompt_key"], chosen["answer_key"])
    check_model_spec(chosen["model"])  # a model that is not there is one line, not a report of zero steps
    chosen["curriculum"] = _curriculum(chosen["curriculum"])
    return SimSettings(**common, **chosen, task_config=SIM_TASK_CONFIGS.get(chosen["task"], "{}"),
                       lr=SIM_LEARNING_RATES.get(chosen["model"]))


def _from_trainer_config(args: argparse.Namespace) -> dict:
    """The settings a --config file decides: the trainer reads the file itself (swarm.sim.run._trainer_toml); the
    workers are each assigned an equal share of a step's prompts, so the honest ones together answer one step's
    worth per version (generation is what a CPU swarm waits on)."""
    from inference.models import check_model_spec
    from swarm.sim.run import task_reference

    given = [name for name in TRAINER_FLAGS if getattr(args, name) is not None]
    if given:
        flag = "--" + given[0].replace("_", "-")
        raise UserError(f"{flag} and --config both set the trainer's {given[0]}: give it in {args.config} only")
    cfg = load_config(args.config, {"steps": args.steps, "eval_every": args.eval_every}).config
    _check_task(cfg.task, cfg.prompt_key, cfg.answer_key)
    check_model_spec(cfg.model)
    # a task file by its full path, so the trainer peer finds it from any directory
    return dict(model=cfg.model, task=task_reference(cfg.task), prompt_key=cfg.prompt_key, answer_key=cfg.answer_key,
                curriculum=cfg.curriculum, steps=cfg.steps, eval_every=cfg.eval_every,
                prompts_per_worker=-(-cfg.prompts_per_step // args.inference), trainer_config=args.config.resolve())


def _check_task(task: str, prompt_key: str, answer_key: str) -> None:
    """A task file that does not load, or a name no reasoning-gym dataset has, is one line before any peer starts:
    otherwise the whole swarm would start, fail inside the trainer's role and end in a report of zero steps."""

    if not is_builtin_task(task):
        load_tasks(task, prompt_key=prompt_key, answer_key=answer_key)  # TaskError: the file and line, the
        # column missing, or the dataset missing from the cache
    else:
        check_builtin_name(task)


def _check_metrics_ports(args: argparse.Namespace) -> None:
    """Every peer's metrics port (the trainer's --metrics-port and the next ones) is valid and free before any peer
    starts: one taken port would otherwise stop the simulation halfway through starting its peers."""

    if not args.metrics_port:
        return
    peers = 1 + args.validators + args.inference + args.cheaters + args.seeds
    if not 0 < args.metrics_port <= 65536 - peers:
        raise UserError(f"--metrics-port {args.metrics_port} leaves no room for {peers} peers' ports below 65536")
    for port in range(args.metrics_port, args.metrics_port + peers):
        check_port_free("127.0.0.1", port)


def _curriculum(spec: str) -> str:
    """A preset name as given, a [[stage]] file by its absolute path (the trainer peer reads it from its own
    directory); anything else is one line before any peer starts."""
    if spec in PRESETS:
        return spec
    if not Path(spec).is_file():
        raise TrainerError(f"--curriculum {spec!r} is neither a preset ({', '.join(PRESETS)}) nor a TOML file")
    return str(Path(spec).resolve())


SIM_MARKER = ".swarm-sim"
"""Written into --out when a simulation starts: only a directory holding it (or an earlier run's report) is cleared."""


def _clear_previous_run(out: Path) -> None:
    """Delete an earlier simulation's directory, and nothing else: `--out ~/project` must not wipe a project."""

    if out.exists() and not out.is_dir():
        raise UserError(f"--out {out} exists and is not a directory")
    if out.is_dir() and any(out.iterdir()):
        if not ((out / SIM_MARKER).exists() or (out / "report.json").exists()):
            raise UserError(f"--out {out} holds files that are not a simulation's; give an empty or new directory")
        shutil.rmtree(out)
    usable_directory(out, "--out directory")
    (out / SIM_MARKER).write_text("a swarm sim run: `swarm sim` deletes this directory when it starts again\n")


_NARRATED = (Published, TrainStep, TrainerWaiting, RoleFailed, DhtFound, Generated, RejectedRollout, Evaluated)


def _narrate(e: Emitted) -> None:
    """The simulation's story: role milestones in the words a peer uses (swarm.event_types' lines), each prefixed
    by the peer's name, plus the watchdog's stall reports and the seed-only peer's copies."""
    event, who = e.event, e.peer or "?"
    line = None
    if isinstance(event, _NARRATED):
        line = event.line()
    elif isinstance(event, Stalled):
        line = (f"no trainer step for {event.seconds:.0f} s: knows v{event.knows}, holds v{event.holds}, "
                f"connected to {event.connected} peers, last: {event.last}{' (STOPPED)' if event.stopped else ''}")
    elif isinstance(event, MetricsListening):
        line = event.message
    elif isinstance(event, WorkerBanned):
        line = f"banned worker {event.worker} ({event.by or 'near_ties'}): {event.reason}"
    elif isinstance(event, Complete) and who.startswith("seed"):
        line = f"mirrored policy v{event.version}"
    elif isinstance(event, Listening) and who == "trainer" and event.addrs:
        line = (
            f"listening on {event.addrs[0]} "
            f"(watch the run from another shell: swarm status --run sim --bootstrap {event.addrs[0]})"
        )
    if line:
        print(f"[{who}] {line}", flush=True)


def _render(report: dict, out: Path) -> str:
    return "\n".join(
        [
            "",
            f"simulation finished in {report['wall_s']} s{' (TIMED OUT)' if report['timed_out'] else ''}",
            f"  trainer steps: {report['steps']}, rewards per step: {report['rewards']}",
            f"  policy versions published: {report['versions_published']}, "
            f"copies completed by peers: {report['policy_copies_completed']}",
            f"  rollout groups generated: {report['groups_generated']}, "
            f"rejecting votes: {report['votes_rejecting']} ({readable_counts(report['rejection_reasons'])})",
            f"  trainer gate: {readable_counts(report['gate'])}",
            f"  banned workers: {report['banned_workers']}",
            f"  final policy: {report['final_policy']}",
            *_heldout_line(report.get("heldout_accuracy")),
            f"  report: {out / 'report.json'} (pictures: {out / 'report.html'})",
        ]
    )


def _heldout_line(accuracy: dict | None) -> list[str]:
    """The trainer's held-out evaluations (swarm.roles.trainer._evaluate): before its first step and after its last."""
    if not accuracy or "before" not in accuracy or "after" not in accuracy:
        return []
    line = (f"  held-out accuracy (greedy, prompts never trained on): before {accuracy['before']:.3f} -> "
            f"after {accuracy['after']:.3f}")
    if "constant_answer" in accuracy:
        line += f" (always giving the most frequent training answer: {accuracy['constant_answer']:.3f})"
    return [line]
