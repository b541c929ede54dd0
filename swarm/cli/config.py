"""`swarm config show`: the effective trainer or peer config, as the TOML file that reproduces it.

Why TOML with each description as a comment: the printout is both the reference of every field (its meaning and
its value here) and a config file to start from: `swarm config show --role peer > peer.toml` loads back to the
same settings. `--json` prints the same values as one JSON object for scripts.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from swarm.config import load_config as load_peer_config
from swarm.config import render_toml as render_peer_toml
from trainer.config import load_config as load_trainer_config
from trainer.config import render_toml as render_trainer_toml
from trainer.typed_config import add_set_flag


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--role", choices=("trainer", "peer"), default="trainer",
                        help="which config: the trainer's (swarm train, a trainer peer's --trainer-config) or the "
                             "peer's (swarm peer start)")
    parser.add_argument("--config", type=Path, metavar="PATH", help="a TOML file to start from (default: none)")
    add_set_flag(parser, "trainer.lr=1e-4")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of commented TOML")


def run(args: argparse.Namespace) -> int:
    print(_show_peer(args) if args.role == "peer" else _show_trainer(args), end="")
    return 0


def _show_trainer(args: argparse.Namespace) -> str:
    loaded = load_trainer_config(args.config, None, args.set)
    if args.json:
        shown = {"trainer": loaded.config.model_dump(mode="json")}
        if loaded.inline_stages:
            shown["stage"] = loaded.curriculum.to_dict()["stages"]
        return json.dumps(shown) + "\n"
    return _header("trainer", args) + render_trainer_toml(loaded)


def _show_peer(args: argparse.Namespace) -> str:
    config = load_peer_config(args.config, {}, args.set)
    if args.json:
        return json.dumps(config.model_dump(mode="json")) + "\n"
    return _header("peer", args) + render_peer_toml(config)


def _header(role: str, args: argparse.Namespace) -> str:
    source = f"{args.config}" if args.config else "the defaults"
    sets = "".join(f" --set {text}" for text in args.set)
    return f"# The effective {role} config: {source}{sets}.\n\n"
