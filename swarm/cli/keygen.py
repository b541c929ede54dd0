"""`swarm keygen PATH [--json]`: create an Ed25519 key file (a run's trainer key or a peer identity).

The file is the raw 32-byte seed with mode 0600, the same format a peer keeps as its identity, so a trainer key can
also be used as the trainer peer's identity. Never overwrites: losing a run's trainer key orphans the run.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("path", type=Path, help="where to write the key (must not exist)")
    parser.add_argument("--json", action="store_true",
                        help="print one JSON object: {public_key, peer_id, path} (the key itself is never printed)")


def run(args: argparse.Namespace) -> int:
    from p2p.identity import Identity, write_key_file

    identity = Identity.generate()
    write_key_file(args.path, identity)
    if args.json:
        print(json.dumps({"public_key": identity.public_bytes.hex(), "peer_id": str(identity.peer_id),
                          "path": str(args.path)}))
        return 0
    print(f"public key: {identity.public_bytes.hex()}")
    print(f"peer id:    {identity.peer_id}")
    print(f"wrote {args.path} (mode 0600); keep it secret, it cannot be recovered")
    return 0
