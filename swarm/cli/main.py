"""The `swarm` command line.

Why a table of lazily imported modules: `swarm --help` and `swarm peer start --role seed` must not import torch
(seed-only peers stay small), so each sub-command lives in its own module, imported only when it runs. Each module
exposes `add_arguments(parser)` and `run(args) -> int`. Errors a user can act on are exceptions whose class sets
`user_facing = True` (each package has one, e.g. `swarm.errors.UserError`); they are printed as one line, never as a
traceback. Ctrl-C and SIGTERM end every command with one line and status 130 or 143 (swarm.shutdown.Interrupts).
`-v` / `--log-level`, before or after the command's words, sets the level of the project's own loggers (third-party
packages such as py-libp2p stay quiet); without them logging stays at WARNING. Every line starts with the UTC time
(swarm.log_lines), and `--log-format json` prints each log record as one JSON object.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
from importlib.metadata import PackageNotFoundError, version

from swarm.log_lines import LOG_FORMATS, install_log_handler
from swarm.progress import silence_library_bars
from swarm.shutdown import Interrupts, is_interrupt

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
    (("config", "show"), "swarm.cli.config", "print the effective trainer or peer config as described TOML"),
    (("bench", "broadcast"), "swarm.bench.broadcast", "benchmark policy broadcast against the Kumar-Ross bound"),
    (("bench", "reach"), "swarm.bench.reach", "benchmark a broadcast to private peers behind relays and NAT"),
    (("bench", "transfer"), "swarm.bench.transfer", "benchmark one piece-protocol stream against raw TCP"),
    (("bench", "channel-open"), "swarm.bench.channel_open", "measure the CPU of opening a data channel, ticket or not"),
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
    (
        ("bench", "sybil"),
        "swarm.bench.sybil",
        "measure what N fresh identities cost a target peer, per attack kind (floods, bombs, links, relays, punches)",
    ),
    (("bench", "scale"), "swarm.bench.scale", "benchmark per-peer protocol cost as the swarm grows; estimate at 1,000"),
    (
        ("bench", "patch"),
        "swarm.bench.patch",
        "measure policy versions as bf16 patches on real RL steps: bytes, times, bit-exact rebuilds, broadcast",
    ),
    (("bench", "fuzz"), "swarm.bench.fuzz", "fuzz every decoder of network input for N seconds; report failures"),
    (("bench", "device"), "swarm.bench.device", "check every GPU path against its CPU twin (prepared GPU check)"),
]


LOG_LEVELS = ("debug", "info", "warning", "error", "critical")
PROJECT_LOGGERS = ("p2p", "verify", "inference", "trainer", "swarm", "tasks")
"""The project's packages: each module logs under its own name (logging.getLogger(__name__)) below one of these."""


def add_logging_flags(parser: argparse.ArgumentParser, default: str | None = None) -> None:
    """-v / --log-level on the top parser (default None: no change) and on every command's (SUPPRESS: a flag given
    before the command's words is not undone by its absence after them)."""
    parser.add_argument("-v", "--verbose", action="count", default=default,
                        help="more log lines from the project's loggers: -v info, -vv debug (default: warnings only)")
    parser.add_argument("--log-level", dest="log_level", type=str.lower, choices=LOG_LEVELS, default=default,
                        help="log level of the project's loggers (overrides -v; default warning)")
    parser.add_argument("--log-format", dest="log_format", type=str.lower, choices=LOG_FORMATS, default=default,
                        help="log lines as text (time, peer, level, logger, message) or one JSON object each; "
                             "json also makes `peer start` print its events as JSON (default text)")


def configure_logging(verbose: int | None, log_level: str | None, log_format: str | None = None) -> None:
    """Log lines to stderr, one handler, in `log_format`; the project's loggers at the level asked for (nothing
    asked, their levels stay as they are: WARNING)."""
    install_log_handler(log_format or "text")
    if log_level is None and not verbose:
        return
    level = getattr(logging, log_level.upper()) if log_level else (logging.INFO if verbose == 1 else logging.DEBUG)
    for name in PROJECT_LOGGERS:
        logging.getLogger(name).setLevel(level)


class _LazyCommand:
    """Defers importing a command's module until its parser is actually needed."""

    def __init__(self, module: str) -> None:
        self.module = module

    def load(self):
        return importlib.import_module(self.module)


class DefaultsHelpFormatter(argparse.HelpFormatter):
    """Shows each option's default after its help, unless the help already names it or there is none to show
    (a flag whose absence means "the config's value" defaults to None and names the config's default itself)."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        if (action.default in (None, False, [], argparse.SUPPRESS) or not action.option_strings
                or "default" in text.lower()):
            return text
        return f"{text} (default: %(default)s)"


def build_parser(argv: list[str]) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="swarm", description=__doc__.split("\n")[0])
    add_logging_flags(parser)
    command_words = _after_global_flags(argv)
    parser.add_argument("--version", action="version", version=f"swarm {_version()}")
    groups: dict[tuple[str, ...], argparse._SubParsersAction] = {
        (): parser.add_subparsers(dest="cmd0", metavar="COMMAND")
    }
    parents: dict[tuple[str, ...], argparse.ArgumentParser] = {(): parser}
    for words, module, help_text in COMMANDS:
        for depth in range(1, len(words)):
            prefix = words[:depth]
            if prefix not in parents:
                sub = groups[prefix[:-1]].add_parser(prefix[-1], help=f"{prefix[-1]} commands")
                sub.set_defaults(_group=prefix)
                parents[prefix] = sub
                groups[prefix] = sub.add_subparsers(dest=f"cmd{depth}", metavar="COMMAND")
        leaf = groups[words[:-1]].add_parser(words[-1], help=help_text, description=help_text,
                                             formatter_class=DefaultsHelpFormatter)
        leaf.set_defaults(_module=module)
        add_logging_flags(leaf, argparse.SUPPRESS)
        # Only the invoked command's module is imported, so its flags are known without paying for the others.
        if list(words) == command_words[: len(words)]:
            _LazyCommand(module).load().add_arguments(leaf)
    parser.set_defaults(_parents=parents)
    return parser


def _after_global_flags(argv: list[str]) -> list[str]:
    """`argv` from the command's first word on: the top parser's flags (-v, --log-level LEVEL) come first."""
    rest = list(argv)
    while rest and rest[0].startswith("-"):
        if rest.pop(0) in ("--log-level", "--log-format") and rest:
            rest.pop(0)
    return rest


def _version() -> str:
    try:
        return version("rl-swarm")
    except PackageNotFoundError:
        return "unknown (not installed)"


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
    silence_library_bars()  # before any command imports transformers: the commands draw their own bars
    with Interrupts().installed() as interrupts:
        return _run_command(list(sys.argv[1:] if argv is None else argv), interrupts)


def _run_command(argv: list[str], interrupts: Interrupts) -> int:
    parser = build_parser(argv)
    args = parser.parse_args(argv)
    module = getattr(args, "_module", None)
    if module is None:  # a command group alone (`swarm peer`) prints its own commands, `swarm` alone all of them
        args._parents[getattr(args, "_group", ())].print_help()
        return 2
    args._argv = argv  # a command that re-launches itself (swarm train --nproc) needs its own words
    configure_logging(args.verbose, args.log_level, args.log_format)
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
