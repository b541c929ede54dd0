"""`swarm tasks [NAME ...] [--json]`: the built-in tasks, each with a one-line description and its difficulty
settings (the defaults a run gets; a trainer TOML's task_config overrides any of them)."""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict

from tasks.catalog import builtin_tasks, scorer_note


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("names", nargs="*", metavar="NAME", help="show only these tasks (default: every one)")
    parser.add_argument("--json", action="store_true", help="print one JSON object: {tasks: [{name, description, "
                                                            "settings}]}")


def run(args: argparse.Namespace) -> int:
    listed = builtin_tasks(args.names)
    if args.json:
        print(json.dumps({"tasks": [asdict(task) for task in listed]}))
        return 0
    width = max(len(task.name) for task in listed)
    for task in listed:
        print(f"{task.name:<{width}}  {task.description}")
        print(f"{'':<{width}}  {_settings_line(task.settings)}")
    print(f"{len(listed)} built-in task(s); set difficulty with task_config in a trainer TOML, e.g. "
          f"task_config = {{max_terms = 4}}; {scorer_note()}. Task files and cached Hugging Face datasets "
          f"(ORG/NAME) work too, with --prompt-key and --answer-key naming their columns.")
    return 0


def _settings_line(settings: dict) -> str:
    if not settings:
        return "(no difficulty settings)"
    return " ".join(f"{key}={json.dumps(value, separators=(',', ':'))}" for key, value in settings.items())
