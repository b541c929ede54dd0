"""`swarm peer start`: run one peer with one or more roles until interrupted.

Seed-only mode (`--role seed`) never imports torch: it joins the run, mirrors every policy version inside the
window, verifies each piece and serves it. The trainer, inference and validator roles import their packages lazily.
"""

from __future__ import annotations

import argparse
from pathlib import Path


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--role", action="append", dest="roles", metavar="ROLE",
                        help="trainer, inference, validator or seed (repeatable; default: seed)")
    parser.add_argument("--config", type=Path, help="TOML config file (section [peer])")
    parser.add_argument("--run", help="run name (default: 'default')")
    parser.add_argument("--trainer-key", dest="trainer_key",
                        help="hex public key of the run's trainer, or a key file; only its manifests are loaded")
    parser.add_argument("--bootstrap", action="append", metavar="MULTIADDR",
                        help="bootstrap peer multiaddr (repeatable); default: bootstrap_peers.txt")
    parser.add_argument("--listen", action="append", metavar="MULTIADDR", help="listen multiaddr (repeatable)")
    parser.add_argument("--data-dir", dest="data_dir", type=Path, help="identity, piece store and lock (default ./swarm-data)")
    parser.add_argument("--keep-versions", dest="keep_versions", type=int, help="policy versions kept on disk")
    parser.add_argument("--upload-mbps", dest="upload_mbps", type=float, help="upload cap in Mbit/s (0 = none)")
    parser.add_argument("--no-reseed", dest="reseed", action="store_const", const=False,
                        help="download only, never upload (single-origin baseline)")
    parser.add_argument("--exit-when-complete", dest="exit_when_complete", action="store_const", const=True,
                        help="exit once the newest policy is complete")
    parser.add_argument("--json-events", dest="json_events", action="store_true",
                        help="print machine-readable JSON event lines instead of progress text")


def run(args: argparse.Namespace) -> int:
    from swarm.config import load_config
    from swarm.node import run_peer

    overrides = {
        "roles": tuple(args.roles) if args.roles else None,
        "run": args.run, "trainer_key": args.trainer_key,
        "bootstrap": tuple(args.bootstrap) if args.bootstrap else None,
        "listen": tuple(args.listen) if args.listen else None,
        "data_dir": args.data_dir, "keep_versions": args.keep_versions, "upload_mbps": args.upload_mbps,
        "reseed": args.reseed, "exit_when_complete": args.exit_when_complete,
    }
    config = load_config(args.config, overrides)
    return run_peer(config, json_events=args.json_events)
