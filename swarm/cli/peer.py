"""`swarm peer start`: run one peer with one or more roles until interrupted.

Seed-only mode (`--role seed`) never imports torch: it joins the run, mirrors every policy version inside the
window, verifies each piece and serves it. The trainer, inference and validator roles import their packages lazily.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import trio

from p2p.bootstrap import resolve_bootstrap
from p2p.identity import load_or_create_identity, read_key_file
from swarm.config import BACKENDS, DEVICES, PRECISIONS, PeerConfig, load_config
from swarm.errors import usable_directory
from swarm.events import EventSink
from swarm.node.gc_warmup import run_freezing_after_warmup
from swarm.node.node import open_node_parts
from swarm.policy.trust import parse_trainer_key
from swarm.progress import DownloadBars, bar_console
from swarm.roles.build import build_roles
from swarm.shutdown import HARD_EXIT_AFTER_S, ExitGuard


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--role", action="append", dest="roles", metavar="ROLE",
                        help="trainer, inference, validator or seed (repeatable; default: seed)")
    parser.add_argument("--config", type=Path, help="TOML config file (section [peer])")
    parser.add_argument("--run", help="run name (default: 'default')")
    parser.add_argument("--trainer-key", dest="trainer_key",
                        help="hex public key of the run's trainer, or a key file; only its manifests are loaded")
    parser.add_argument("--bootstrap", action="append", metavar="MULTIADDR",
                        help="bootstrap peer multiaddr (repeatable); default: bootstrap_peers.txt")
    parser.add_argument("--listen", action="append", metavar="MULTIADDR",
                        help="listen multiaddr (repeatable); /ip4/0.0.0.0/tcp/4001 for peers on other machines")
    parser.add_argument("--announce", action="append", metavar="MULTIADDR",
                        help="address other peers should dial instead (repeatable; e.g. a public NAT address)")
    parser.add_argument(
        "--data-dir", dest="data_dir", type=Path, help="identity, piece store and lock (default ./swarm-data)"
    )
    parser.add_argument("--keep-versions", dest="keep_versions", type=int, help="policy versions kept on disk")
    parser.add_argument("--upload-mbps", dest="upload_mbps", type=float,
                        help="upload cap in Mbit/s over every version served (0 = none)")
    parser.add_argument("--no-reseed", dest="reseed", action="store_const", const=False,
                        help="download only, never upload (single-origin baseline)")
    parser.add_argument("--exit-when-complete", dest="exit_when_complete", action="store_const", const=True,
                        help="exit once the newest policy is complete")
    parser.add_argument("--exit-when-trained", dest="exit_when_trained", action="store_const", const=True,
                        help="trainer role: exit once the configured steps are done and the final policy is saved")
    parser.add_argument("--json-events", dest="json_events", action="store_true",
                        help="print machine-readable JSON event lines instead of progress text")
    parser.add_argument("--key", type=Path, help="identity key file (the trainer's run key; default: data dir's)")
    parser.add_argument("--model", help="base model of trainer/inference/validator roles: tiny, smollm2, a dir or a "
                                        "cached Hugging Face hub id")
    parser.add_argument("--backend", choices=BACKENDS,
                        help="inference role: generation backend, torch (CPU) or vllm (GPU, the gpu extra)")
    parser.add_argument("--gpu-memory", dest="gpu_memory", type=float,
                        help="inference role with vllm: share of the GPU's memory it may take (default 0.3)")
    parser.add_argument("--device", choices=DEVICES,
                        help="validator and trainer roles: where they compute (default auto: a CUDA GPU when present)")
    parser.add_argument("--precision", choices=PRECISIONS,
                        help="trainer role: what the run's workers generate in (bfloat16 for vLLM on GPUs)")
    parser.add_argument("--trainer-config", dest="trainer_config", type=Path,
                        help="trainer role: TOML of GRPO and curriculum settings (trainer/configs/*.toml)")
    parser.add_argument("--prompts-per-worker", dest="prompts_per_worker", type=int,
                        help="trainer role: prompts each inference peer answers per version")
    parser.add_argument("--replicas", type=int, help="trainer role: validators assigned to each rollout")
    parser.add_argument("--quorum", type=int, help="trainer role: accepting votes a rollout needs")
    parser.add_argument("--validator-key", action="append", dest="validator_keys", metavar="KEY",
                        help="trainer role: a validator it may name (peer id, hex public key or key file; "
                             "repeatable); default: every peer announcing the validator role")


def run(args: argparse.Namespace) -> int:

    overrides = {
        "roles": tuple(args.roles) if args.roles else None,
        "run": args.run, "trainer_key": args.trainer_key,
        "bootstrap": tuple(args.bootstrap) if args.bootstrap else None,
        "listen": tuple(args.listen) if args.listen else None,
        "announce": tuple(args.announce) if args.announce else None,
        "data_dir": args.data_dir, "keep_versions": args.keep_versions, "upload_mbps": args.upload_mbps,
        "reseed": args.reseed, "exit_when_complete": args.exit_when_complete,
        "exit_when_trained": args.exit_when_trained, "model": args.model,
        "backend": args.backend, "device": args.device, "precision": args.precision, "gpu_memory": args.gpu_memory,
        "trainer_config": args.trainer_config, "prompts_per_worker": args.prompts_per_worker,
        "replicas": args.replicas, "quorum": args.quorum,
        "validator_keys": tuple(args.validator_keys) if args.validator_keys else None,
    }
    config = load_config(args.config, overrides)
    refuse_before_writing(config, args.key)
    return run_peer(config, json_events=args.json_events, key_file=args.key)


def refuse_before_writing(config, key_file: Path | None) -> None:
    """Every check of the peer's settings that needs no network, run before its data directory and identity key
    exist: a refused command leaves nothing behind (a stray key would become that directory's identity later)."""
    resolve_bootstrap(config.bootstrap or None, None, config.bootstrap_file if config.bootstrap_file.exists() else None)
    if key_file is not None:
        read_key_file(key_file)
    build_roles(config)
    parse_trainer_key(config.trainer_key)


def run_peer(config: PeerConfig, json_events: bool = False, key_file=None) -> int:
    """Entry point of `swarm peer start`: build the roles, run until interrupted."""
    bars = DownloadBars(bar_console(json_events))
    events = EventSink(json_lines=json_events, hidden=bars.drawn_kinds)
    events.listeners.append(bars.on_event)
    events.configure_logging()
    usable_directory(config.data_dir, "data directory")
    if key_file is not None:
        identity = read_key_file(key_file)
    else:
        identity = load_or_create_identity(config.data_dir)
    roles = build_roles(config)
    trust_key = parse_trainer_key(config.trainer_key)
    if "trainer" in config.roles:
        trust_key = identity.public_bytes  # the trainer's identity is the run's key
    guard = ExitGuard(HARD_EXIT_AFTER_S)
    try:
        status = trio.run(run_freezing_after_warmup, open_node_parts, config, identity, events, roles, trust_key,
                          lambda node: guard.arm(1 if node.failed else 0))
    finally:
        bars.close()
    guard.disarm()
    return status
