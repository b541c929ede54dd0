"""`swarm peer start`: run one peer with one or more roles until interrupted.

Seed-only mode (`--role seed`) never imports torch: it joins the run, mirrors every policy version inside the
window, verifies each piece and serves it. The trainer, inference and validator roles import their packages lazily.
Every flag below sets one field of the peer's config (swarm/config.py); `--set SECTION.FIELD=VALUE` sets any field.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from p2p.bootstrap import resolve_bootstrap
from p2p.identity import load_or_create_identity, read_key_file
from swarm.cli.train import add_report_to
from swarm.config import (
    BACKENDS,
    DEVICES,
    PRECISIONS,
    InferenceSection,
    LimitsSection,
    MirrorSection,
    PeerConfig,
    PeerSection,
    TrainerRoleSection,
    load_config,
)
from swarm.errors import usable_directory
from swarm.events import EventSink
from swarm.log_lines import set_line_name, short_peer_name
from swarm.node.gc_warmup import run_freezing_after_warmup
from swarm.node.metrics import check_port_free
from swarm.node.node import open_node_parts
from swarm.policy.trust import parse_trainer_key
from swarm.progress import DownloadBars, bar_console
from swarm.roles.build import build_roles
from swarm.shutdown import HARD_EXIT_AFTER_S, ExitGuard, run_trio
from trainer.typed_config import add_field_flag, add_set_flag

MULTIADDR = {"metavar": "MULTIADDR"}

_FLAGS: list[tuple[type, str, tuple[str, ...], dict]] = [
    (PeerSection, "roles", ("--role",), {"metavar": "ROLE", "help": "trainer, inference, validator or seed "
                                                                    "(repeatable; default: seed)"}),
    (PeerSection, "run", (), {}),
    (PeerSection, "trainer_key", (), {}),
    (PeerSection, "bootstrap", (), {**MULTIADDR, "help": "bootstrap peer multiaddr (repeatable); default: "
                                                         "bootstrap_peers.txt"}),
    (PeerSection, "listen", (), {**MULTIADDR, "help": "listen multiaddr (repeatable; default: "
                                                      "/ip4/127.0.0.1/tcp/0); /ip4/0.0.0.0/tcp/4001 for peers on "
                                                      "other machines"}),
    (PeerSection, "announce", (), {**MULTIADDR, "help": "address other peers should dial instead (repeatable; "
                                                        "e.g. a public NAT address; default: the listen addresses)"}),
    (PeerSection, "data_dir", (), {}),
    (PeerSection, "bootstrap_timeout_s", ("--bootstrap-timeout",), {"dest": "bootstrap_timeout_s", "metavar": "S"}),
    (PeerSection, "wrong_key_timeout_s", ("--wrong-key-timeout",), {"dest": "wrong_key_timeout_s", "metavar": "S"}),
    (MirrorSection, "keep_versions", (), {}),
    (LimitsSection, "upload_mbps", (), {}),
    (PeerSection, "model", (), {}),
    (PeerSection, "device", (), {"choices": DEVICES}),
    (InferenceSection, "backend", (), {"choices": BACKENDS}),
    (InferenceSection, "gpu_memory", (), {}),
    (TrainerRoleSection, "precision", (), {"choices": PRECISIONS}),
    (TrainerRoleSection, "config", ("--trainer-config",), {"dest": "trainer_config"}),
    (TrainerRoleSection, "prompts_per_worker", (), {}),
    (TrainerRoleSection, "replicas", (), {}),
    (TrainerRoleSection, "quorum", (), {}),
    (TrainerRoleSection, "validator_keys", ("--validator-key",), {"metavar": "KEY"}),
]
"""(section, field, flag names (default: --field-name), argparse options): the fields with a flag of their own."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", type=Path, metavar="PATH",
                        help="peer TOML file ([peer], [mirror], [limits], [trainer], [inference] tables, or one "
                             "flat [peer] table); flags and --set override it")
    for section, field, names, options in _FLAGS:
        add_field_flag(parser, section, field, *names, **options)
    parser.add_argument("--no-reseed", dest="reseed", action="store_const", const=False,
                        help="download only, never upload (single-origin baseline)")
    parser.add_argument("--exit-when-complete", dest="exit_when_complete", action="store_const", const=True,
                        help="exit once the newest policy is complete")
    parser.add_argument("--exit-when-trained", dest="exit_when_trained", action="store_const", const=True,
                        help="trainer role: exit once the configured steps are done and the final policy is saved")
    add_set_flag(parser, "trainer.quorum_timeout_s=60")
    parser.add_argument("--json", action="store_true",
                        help="print machine-readable JSON event lines instead of progress text")
    parser.add_argument("--json-events", dest="json", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--identity-key", dest="identity_key", type=Path, metavar="PATH",
                        help="this peer's identity key file (a trainer peer's is the run key; default: the data "
                             "directory's own)")
    parser.add_argument("--key", dest="identity_key", type=Path, help=argparse.SUPPRESS)
    add_report_to(parser, "trainer role: ")
    add_metrics_port(parser)
    parser.add_argument("--metrics-host", dest="metrics_host", metavar="HOST",
                        help="address the metrics endpoint listens on (default 127.0.0.1; 0.0.0.0 for a remote "
                             "Prometheus)")


def add_metrics_port(parser: argparse.ArgumentParser, what: str = "this peer's") -> None:
    parser.add_argument("--metrics-port", dest="metrics_port", type=int, metavar="PORT",
                        help=f"serve {what} Prometheus metrics (pieces, gossip, votes, gate, generation) on this "
                             "TCP port at /metrics (default 0: off)")


def run(args: argparse.Namespace) -> int:
    overrides = {field: _flag_value(getattr(args, field)) for field in
                 ("roles", "run", "trainer_key", "bootstrap", "listen", "announce", "data_dir", "keep_versions",
                  "upload_mbps", "reseed", "exit_when_complete", "exit_when_trained", "model", "backend", "device",
                  "precision", "gpu_memory", "trainer_config", "prompts_per_worker", "replicas", "quorum",
                  "validator_keys", "metrics_port", "metrics_host", "bootstrap_timeout_s", "wrong_key_timeout_s")}
    overrides["report_to"] = ",".join(args.report_to) if args.report_to else None
    config = load_config(args.config, overrides, args.set)
    refuse_before_writing(config, args.identity_key)
    json_events = args.json or getattr(args, "log_format", None) == "json"
    return run_peer(config, json_events=json_events, key_file=args.identity_key)


def _flag_value(value: object) -> object:
    """A repeatable flag's list as the tuple its field holds (None when the flag was not given)."""
    return tuple(value) if isinstance(value, list) else value


def refuse_before_writing(config: PeerConfig, key_file: Path | None) -> None:
    """Every check of the peer's settings that needs no network, run before its data directory and identity key
    exist: a refused command leaves nothing behind (a stray key would become that directory's identity later)."""
    peer = config.peer
    resolve_bootstrap(peer.bootstrap or None, None, peer.bootstrap_file if peer.bootstrap_file.exists() else None)
    if key_file is not None:
        read_key_file(key_file)
    build_roles(config)
    parse_trainer_key(peer.trainer_key)
    check_port_free(peer.metrics_host, peer.metrics_port)


def run_peer(config: PeerConfig, json_events: bool = False, key_file: Path | None = None) -> int:
    """Entry point of `swarm peer start`: build the roles, run until interrupted."""
    bars = DownloadBars(bar_console(json_events))
    events = EventSink(json_lines=json_events, hidden=bars.drawn_kinds)
    events.listeners.append(bars.on_event)
    events.configure_logging()
    usable_directory(config.peer.data_dir, "data directory")
    if key_file is not None:
        identity = read_key_file(key_file)
    else:
        identity = load_or_create_identity(config.peer.data_dir)
    set_line_name(short_peer_name(identity.peer_id))
    roles = build_roles(config)
    trust_key = parse_trainer_key(config.peer.trainer_key)
    if "trainer" in config.peer.roles:
        trust_key = identity.public_bytes  # the trainer's identity is the run's key
    guard = ExitGuard(HARD_EXIT_AFTER_S)
    try:
        status = run_trio(run_freezing_after_warmup, open_node_parts, config, identity, events, roles, trust_key,
                          lambda node: guard.arm(1 if node.failed else 0))
    finally:
        bars.close()
    guard.disarm()
    return status
