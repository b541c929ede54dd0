"""`swarm publish CHECKPOINT_DIR --run NAME --key KEYFILE`: sign a checkpoint as the run's next version and seed it.

The checkpoint directory holds *.safetensors files and a model.json model description (what `swarm train` writes
into OUT/final and a trainer peer into each version), or is a plain Hugging Face model directory (config.json,
safetensors, tokenizer files; a hub id names its snapshot in the local Hugging Face cache): its model.json is
then written from those files into the publisher's data directory, beside links to its weights, and the user's
directory is never written to. An optional generation.json gives the
generation settings in force (group_size, temperature, max_new_tokens, and the curriculum stage: its index, as
stage_index beside the stage's name, or as stage). The publisher's host uses the trainer key as its identity, so
peers see the manifest's signer as the origin. It prints its multiaddr (hand it to others as --bootstrap) and live
progress, and seeds until interrupted.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import time
from pathlib import Path
from typing import TYPE_CHECKING

import trio

from inference.errors import InferenceError
from p2p.errors import ManifestError, P2PError
from p2p.pieces.manifest import (
    MAX_PIECE_SIZE,
    MIN_PIECE_SIZE,
    GenerationSettings,
    build_manifest,
    describe_policy_dir,
    read_safetensors_index,
    sign_manifest,
)
from swarm.errors import UserError
from swarm.event_types import Published, Warned
from swarm.events import EventSink
from swarm.shutdown import run_trio
from tasks.hub_cache import parse_reference

if TYPE_CHECKING:
    from swarm.node.state import Node


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("checkpoint_dir", type=Path,
                        help="directory with *.safetensors and model.json (swarm train's OUT/final), a plain "
                             "Hugging Face model directory, or a hub id in the local Hugging Face cache")
    parser.add_argument("--run", required=True, help="run name")
    parser.add_argument("--run-key", dest="run_key", type=Path, metavar="PATH",
                        help="the run's trainer key file, which signs the version (swarm keygen); required")
    parser.add_argument("--key", dest="run_key", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--version", type=int,
                        help="policy version (default: one past the newest this data dir holds or the swarm knows)")
    parser.add_argument("--data-dir", dest="data_dir", type=Path, default=Path("./swarm-publisher"),
                        help="the publisher's identity, piece store and lock")
    parser.add_argument("--listen", action="append", metavar="MULTIADDR", help="listen multiaddr (repeatable)")
    parser.add_argument("--bootstrap", action="append", metavar="MULTIADDR",
                        help="bootstrap peer multiaddr (repeatable); default: bootstrap_peers.txt")
    parser.add_argument("--piece-kb", dest="piece_kb", type=int, default=1024, help="piece size in KiB")
    parser.add_argument("--upload-mbps", dest="upload_mbps", type=float, default=0.0,
                        help="upload cap in Mbit/s over every version served (0 = none)")
    parser.add_argument("--announce-after-peers", dest="announce_after", type=int, default=0,
                        help="wait until this many peers are connected before announcing (benchmarks)")
    parser.add_argument("--json", action="store_true", help="print machine-readable JSON event lines")
    parser.add_argument("--json-events", dest="json", action="store_true", help=argparse.SUPPRESS)


def _generation(checkpoint: Path):
    path = checkpoint / "generation.json"
    raw = {"group_size": 8, "temperature": 0.6, "max_new_tokens": 256, "stage": 0}
    if path.exists():
        try:
            raw.update(json.loads(path.read_text()))
            # a trainer names its stage ("all@6") and gives its index as stage_index; the manifest carries the index
            stage = raw["stage_index"] if "stage_index" in raw else raw["stage"]
            return GenerationSettings(int(raw["group_size"]), float(raw["temperature"]), int(raw["max_new_tokens"]),
                                      int(stage))
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise UserError(f"{path} is not a valid generation settings file ({exc})") from None
    return GenerationSettings(**raw)


def _hf_description(checkpoint: Path) -> dict | None:
    """None for a directory with its own model.json; for a plain Hugging Face model directory, the model.json
    that publishing it needs, built from its config and tokenizer files; one sentence when it is neither."""

    if (checkpoint / "model.json").exists() or not (checkpoint / "config.json").exists():
        return None
    from inference.models import describe_files

    try:
        return describe_files(checkpoint)
    except InferenceError as exc:
        raise UserError(f"cannot publish {checkpoint}: {exc}") from None


def _checkpoint_dir(path: Path) -> Path:
    """The directory to publish: `path` itself, or a Hugging Face hub id's snapshot in the local cache."""

    if path.is_dir():
        return path
    if parse_reference(str(path)) is None:
        raise UserError(f"checkpoint directory {path} does not exist")
    from inference.models import resolve_model_dir

    return resolve_model_dir(str(path))


def check_weights(checkpoint: Path) -> None:
    """What describe_policy_dir checks of the weights (at least one file, each header a safetensors index)."""

    paths = sorted(checkpoint.glob("*.safetensors"))
    if not paths:
        raise ManifestError(f"{checkpoint} holds no .safetensors files")
    for path in paths:
        read_safetensors_index(path)


def stage_hf_directory(checkpoint: Path, description: dict, staging: Path) -> Path:
    """`staging` made a policy directory of `checkpoint`'s weights: a hard link to each *.safetensors file (a
    symbolic link across file systems) and the model.json written from `description`, by rename. Why a directory
    of its own per version: the piece store serves a published version's files from their paths for as long as it
    keeps that version."""

    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    for weights in sorted(checkpoint.glob("*.safetensors")):
        try:
            os.link(weights.resolve(), staging / weights.name)
        except OSError:
            os.symlink(weights.resolve(), staging / weights.name)
    partial = staging / ".model.json.partial"
    partial.write_text(json.dumps(description, indent=1, sort_keys=True))
    os.replace(partial, staging / "model.json")
    return staging


SWARM_VERSION_WAIT_S = 15.0
"""How long `swarm publish` asks the swarm for the run's newest version before numbering its own."""


async def next_version(node: Node, run: str, trainer_key: bytes, wait_s: float = SWARM_VERSION_WAIT_S) -> int:
    """One past the newest version of `run` that this data directory holds or the swarm knows (the DHT's signed
    latest-manifest record, or a manifest gossip or heartbeats brought meanwhile).

    Why ask the swarm: a publisher started on a fresh data directory numbered its checkpoint v1, and every peer of
    a run already at v5 dropped it as older than its window, silently."""

    known = [m.version for m in node.mirror.store.manifests() if m.run == run]
    if node.connected_peers():
        with trio.move_on_after(wait_s):
            try:
                record = await node.dht.get_latest_manifest(run, trainer_key)
            except P2PError as exc:
                record = None
                node.events.emit(Warned(message=f"could not ask the DHT for the run's newest version: {exc}"))
            if record is not None:
                known.append(record.version)
    newest = node.mirror.latest()
    if newest is not None and newest.manifest.run == run:
        known.append(newest.manifest.version)
    return max(known, default=0) + 1


def run(args: argparse.Namespace) -> int:
    from p2p.identity import read_key_file
    from swarm.config import load_config
    from swarm.node.node import open_node_parts

    if args.run_key is None:
        raise UserError("swarm publish needs --run-key FILE, the run's trainer key that signs the version")
    args.checkpoint_dir = _checkpoint_dir(args.checkpoint_dir)
    if not MIN_PIECE_SIZE <= args.piece_kb * 1024 <= MAX_PIECE_SIZE:
        raise UserError(f"--piece-kb must be between {MIN_PIECE_SIZE // 1024} and {MAX_PIECE_SIZE // 1024}")
    hf_description = _hf_description(args.checkpoint_dir)
    try:  # a checkpoint that cannot be published is said before a peer starts, in one line
        if hf_description is None:
            describe_policy_dir(args.checkpoint_dir)
        else:
            check_weights(args.checkpoint_dir)
    except ManifestError as exc:
        raise UserError(f"cannot publish {args.checkpoint_dir}: {exc}") from None
    key = read_key_file(args.run_key)
    config = load_config(None, {"roles": ("seed",), "run": args.run, "data_dir": args.data_dir,
                                "listen": tuple(args.listen or ()), "bootstrap": tuple(args.bootstrap or ()),
                                "upload_mbps": args.upload_mbps, "piece_kb": args.piece_kb,
                                "trainer_key": key.public_bytes.hex()})
    events = EventSink(json_lines=args.json)
    events.configure_logging()
    generation = _generation(args.checkpoint_dir)

    async def publish(node: Node) -> None:
        version = args.version if args.version is not None else await next_version(node, args.run, key.public_bytes)
        policy_dir = args.checkpoint_dir if hf_description is None else stage_hf_directory(
            args.checkpoint_dir, hf_description, config.peer.data_dir / "staged" / f"{args.run}-v{version}")
        manifest = build_manifest(policy_dir, run=args.run, version=version,
                                  parent_version=version - 1 if version > 0 else None, created_at=time.time(),
                                  generation=generation, piece_size=args.piece_kb * 1024)
        signed = sign_manifest(manifest, key.sign, key.public_bytes).to_bytes()
        while len(node.connected_peers()) < args.announce_after:
            await trio.sleep(0.1)
        node.mirror.adopt(signed, local_dir=policy_dir)
        events.emit(Published(version=version, id=manifest.id.hex(), bytes=manifest.total_size,
                              trainer_key=key.public_bytes.hex()))
        await node.announce_policy(signed, manifest)

    return run_trio(open_node_parts, config, key, events, [publish], key.public_bytes)
