"""The `swarm` command line.

Why a table of lazily imported modules: `swarm --help` and `swarm peer start --role seed` must not import torch
(seed-only peers stay small), so each sub-command lives in its own module, imported only when it runs. Each module
exposes `add_arguments(parser)` and `run(args) -> int`. Errors a user can act on are exceptions whose class sets
`user_facing = True` (each package has one, e.g. `swarm.errors.UserError`); they are printed as one line, never as a
traceback. Ctrl-C and SIGTERM end every command with one line and status 130 or 143 (swarm.shutdown.Interrupts).
"""

from __future__ import annotations

import argparse
import importlib
import sys

# (command words, module, one-line help)
COMMANDS: list[tuple[tuple[str, ...], str, str]] = [
    (("peer", "start"), "swarm.cli.peer", "start a peer (roles: trainer, inference, validator, seed)"),
    (("publish",), "swarm.cli.publish", "sign a checkpoint directory as the run's next policy version and seed it"),
    (("status",), "swarm.cli.status", "listen to a run for a while and show its peers, versions, rollouts and votes"),
    (("sim",), "swarm.cli.sim", "run a local multi-peer simulation of the whole swarm in one command"),
    (("train",), "swarm.cli.train", "run the single-machine RL loop (no network)"),
    (("eval",), "swarm.cli.eval", "measure a policy's accuracy on held-out prompts"),
    (("tasks",), "swarm.cli.tasks", "list the built-in tasks with their descriptions and difficulty settings"),
    (("keygen",), "swarm.cli.keygen", "create an Ed25519 key file (a run's trainer key or a peer identity)"),
    (("bench", "broadcast"), "swarm.bench.broadcast", "benchmark policy broadcast against the Kumar-Ross bound"),
    (("bench", "transfer"), "swarm.bench.transfer", "benchmark one piece-protocol stream against raw TCP"),
    (("bench", "verify"), "swarm.bench.verify", "benchmark rollout validation on honest and attacked groups"),
    (("bench", "generate"), "swarm.bench.generate", "benchmark generation throughput and proof overhead"),
    (("bench", "noise"), "swarm.bench.noise", "benchmark the seeded Gumbel noise draw per element"),
    (
        ("bench", "curriculum"),
        "swarm.bench.curriculum",
        "compare FastCuRL's curriculum with a fixed context at one budget of generated tokens, over seeds",
    ),
    (
        ("bench", "gossip-flood"),
        "swarm.bench.gossip_flood",
        "measure what a hostile gossip peer (floods, inflating envelopes) costs a target process",
    ),
    (
        ("bench", "stalled-preambles"),
        "swarm.bench.stalled_preambles",
        "measure what stalled data-channel preambles of many fresh identities cost a target process",
    ),
    (
        ("bench", "churn"),
        "swarm.bench.churn",
        "keep killing and restarting peers of a training run; count its steps",
    ),
    (("bench", "fuzz"), "swarm.bench.fuzz", "fuzz every decoder of network input for N seconds; report failures"),
    (("bench", "device"), "swarm.bench.device", "check every GPU path against its CPU twin (prepared GPU check)"),
]


class _LazyCommand:
    """Defers importing a command's module until its parser is actually needed."""

    def __init__(self, module: str) -> None:
        self.module = module

    def load(self):
        return importlib.import_module(self.module)


def build_parser(argv: list[str]) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="swarm", description=__doc__.split("\n")[0])
    groups: dict[tuple[str, ...], argparse._SubParsersAction] = {
        (): parser.add_subparsers(dest="cmd0", metavar="COMMAND")
    }
    parents: dict[tuple[str, ...], argparse.ArgumentParser] = {(): parser}
    for words, module, help_text in COMMANDS:
        for depth in range(1, len(words)):
            prefix = words[:depth]
            if prefix not in parents:
                sub = groups[prefix[:-1]].add_parser(prefix[-1], help=f"{prefix[-1]} commands")
                parents[prefix] = sub
                groups[prefix] = sub.add_subparsers(dest=f"cmd{depth}", metavar="COMMAND")
        leaf = groups[words[:-1]].add_parser(words[-1], help=help_text, description=help_text)
        leaf.set_defaults(_module=module)
        # Only the invoked command's module is imported, so its flags are known without paying for the others.
        if list(words) == argv[: len(words)]:
            _LazyCommand(module).load().add_arguments(leaf)
    return parser


def user_facing_error(exc: BaseException) -> BaseException | None:
    """The error to print in one line: `exc` itself, or the first error of an exception group all of whose errors
    are user-facing (a host that cannot listen fails inside a peer's nurseries); None for anything else (a bug)."""
    leaves, pending = [], [exc]
    while pending:
        current = pending.pop(0)
        if isinstance(current, BaseExceptionGroup):
            pending[:0] = list(current.exceptions)
        else:
            leaves.append(current)
    if leaves and all(getattr(leaf, "user_facing", False) for leaf in leaves):
        return leaves[0]
    return None


def main(argv: list[str] | None = None) -> int:
    from swarm.progress import silence_library_bars
    from swarm.shutdown import Interrupts

    silence_library_bars()  # before any command imports transformers: the commands draw their own bars
    with Interrupts().installed() as interrupts:
        return _run_command(list(sys.argv[1:] if argv is None else argv), interrupts)


def _run_command(argv: list[str], interrupts) -> int:
    from swarm.shutdown import is_interrupt

    parser = build_parser(argv)
    args = parser.parse_args(argv)
    module = getattr(args, "_module", None)
    if module is None:
        parser.print_help()
        return 2
    args._argv = argv  # a command that re-launches itself (swarm train --nproc) needs its own words
    try:
        status = int(importlib.import_module(module).run(args) or 0)
    except BaseException as exc:  # only interrupts and user-facing errors end here; bugs re-raise below
        if is_interrupt(exc):
            return interrupts.finish()
        reported = user_facing_error(exc) if isinstance(exc, Exception) else None
        if reported is None:
            raise
        print(f"swarm: error: {reported}", file=sys.stderr)
        return 2
    # a SIGTERM whose KeyboardInterrupt a command caught still ends the process as terminated
    return interrupts.finish() if interrupts.received is not None else status


if __name__ == "__main__":
    sys.exit(main())
