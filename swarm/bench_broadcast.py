"""`swarm bench broadcast`: a seed and N real peers (separate `swarm` processes on loopback) share one policy.

What is measured, in one run so the ratios are fair on a noisy machine:
- t_swarm_s: from the publisher's announcement to the last peer holding every verified piece, peers re-seeding;
- t_single_origin_s: the same peers and caps, each fetching from the seed alone (`--no-reseed`);
- t_min_s: the Kumar-Ross bound max(F/U0, N*F/(U0 + N*u)) for those caps;
- seed_upload_ratio: bytes the seed uploaded (summed from what each peer received from it) / file size;
- all_verified: after the peers exit, every peer's store is reassembled and compared (BLAKE3) with the original;
- peer_max_rss_mb: the largest peak RSS of a peer process (seed-only peers never load whole files).
Peers start first and the publisher announces once all are subscribed, so process start-up is not counted.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import blake3

from swarm.errors import UserError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--peers", type=int, default=8)
    parser.add_argument("--size-mb", dest="size_mb", type=float, default=32)
    parser.add_argument("--upload-mbps", dest="upload_mbps", type=float, default=32, help="each peer's upload cap")
    parser.add_argument("--seed-upload-mbps", dest="seed_upload_mbps", type=float, default=32)
    parser.add_argument("--piece-kb", dest="piece_kb", type=int, default=256)
    parser.add_argument("--no-baseline", dest="baseline", action="store_false", help="skip the single-origin run")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds before a phase is abandoned")
    parser.add_argument("--work-dir", dest="work_dir", type=Path, help="keep files here (default: a temp dir)")
    parser.add_argument("--json", action="store_true", help="print only the JSON result")


def _make_checkpoint(path: Path, size_mb: float) -> bytes:
    """A safetensors file of `size_mb` MiB of random float32 values plus model.json; returns its BLAKE3."""
    import numpy as np
    from safetensors.numpy import save_file

    path.mkdir(parents=True, exist_ok=True)
    n = max(1, int(size_mb * 2**20 / 4))
    save_file({"weight": np.random.default_rng(0).standard_normal(n, dtype=np.float32)}, str(path / "model.safetensors"))
    (path / "model.json").write_text(json.dumps({"architecture": "bench", "tokenizer": "none"}))
    return blake3.blake3((path / "model.safetensors").read_bytes()).digest()


class _Proc:
    """A `swarm` child process whose JSON event lines are read as they come."""

    def __init__(self, args: list[str], log_path: Path) -> None:
        self.log = open(log_path, "w")
        self.popen = subprocess.Popen([sys.executable, "-m", "swarm", *args], stdout=subprocess.PIPE,
                                      stderr=self.log, text=True, bufsize=1)
        self.events: list[dict] = []

    def next_event(self) -> dict | None:
        line = self.popen.stdout.readline()
        if not line:
            return None
        self.log.write(line)
        event = json.loads(line)
        self.events.append(event)
        return event

    def wait_for(self, kind: str) -> dict:
        while (event := self.next_event()) is not None:
            if event["event"] == kind:
                return event
        raise UserError(f"a benchmark process exited before '{kind}'; see {self.log.name}")

    def stop(self) -> None:
        if self.popen.poll() is None:
            self.popen.terminate()
            try:
                self.popen.wait(10)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait()
        self.log.close()


def _phase(work: Path, args, key_hex: str, reseed: bool) -> dict:
    tag = "swarm" if reseed else "single"
    pub = _Proc(["publish", str(work / "ckpt"), "--run", f"bench-{tag}", "--key", str(work / "trainer.key"),
                 "--data-dir", str(work / f"{tag}-seed"), "--piece-kb", str(args.piece_kb),
                 "--upload-mbps", str(args.seed_upload_mbps), "--announce-after-peers", str(args.peers),
                 "--json-events"], work / f"{tag}-seed.log")
    peers: list[_Proc] = []
    try:
        seed_addr = pub.wait_for("listening")["addrs"][0]
        seed_id = seed_addr.rsplit("/", 1)[1]
        for i in range(args.peers):
            flags = ["peer", "start", "--role", "seed", "--run", f"bench-{tag}", "--trainer-key", key_hex,
                     "--bootstrap", seed_addr, "--data-dir", str(work / f"{tag}-peer{i}"),
                     "--upload-mbps", str(args.upload_mbps), "--exit-when-complete", "--json-events"]
            peers.append(_Proc(flags + ([] if reseed else ["--no-reseed"]), work / f"{tag}-peer{i}.log"))
        published = pub.wait_for("published")
        deadline = time.monotonic() + args.timeout
        finished = []
        for p in peers:
            finished.append(p.wait_for("finished"))
            if time.monotonic() > deadline:
                raise UserError(f"the {tag} phase took longer than {args.timeout:g} s")
        for p in peers:
            p.popen.wait(30)
    finally:
        for p in peers + [pub]:
            p.stop()
    t_done = max(f["t"] for f in finished)
    seed_up = sum(f["down_from"].get(seed_id, 0) for f in finished)
    return {"t": t_done - published["t"], "seed_upload_bytes": seed_up,
            "max_rss_mb": max(f["max_rss_mb"] for f in finished),
            "manifest_id": published["id"], "verified": _verify(work, tag, args.peers, published["id"])}


def _verify(work: Path, tag: str, peers: int, manifest_hex: str) -> bool:
    """Reassemble every peer's copy from its store and compare it with the original file."""
    from p2p.store import PieceStore

    original = blake3.blake3((work / "ckpt" / "model.safetensors").read_bytes()).digest()
    for i in range(peers):
        with PieceStore(work / f"{tag}-peer{i}" / "store") as store:
            manifest = store.manifest(bytes.fromhex(manifest_hex))
            if manifest is None or not store.is_complete(manifest):
                return False
            out = store.reassemble(manifest, work / f"{tag}-peer{i}" / "out")
            if blake3.blake3((out / "model.safetensors").read_bytes()).digest() != original:
                return False
    return True


def run(args: argparse.Namespace) -> int:
    from p2p.identity import Identity, write_key_file
    from p2p.kumar_ross import min_distribution_time

    if args.peers < 1 or args.size_mb <= 0 or args.upload_mbps <= 0 or args.seed_upload_mbps <= 0:
        raise UserError("peers, size and upload caps must be positive")
    with tempfile.TemporaryDirectory(prefix="swarm-bench-") as tmp:
        work = args.work_dir or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        _make_checkpoint(work / "ckpt", args.size_mb)
        key = Identity.generate()
        if not (work / "trainer.key").exists():
            write_key_file(work / "trainer.key", key)
        from p2p.identity import read_key_file

        key_hex = read_key_file(work / "trainer.key").public_bytes.hex()
        file_bytes = (work / "ckpt" / "model.safetensors").stat().st_size
        swarm = _phase(work, args, key_hex, reseed=True)
        single = _phase(work, args, key_hex, reseed=False) if args.baseline else None
    t_min = min_distribution_time(file_bytes, args.seed_upload_mbps * 1e6 / 8, args.upload_mbps * 1e6 / 8, args.peers)
    result = {
        "peers": args.peers, "size_mb": args.size_mb, "piece_kb": args.piece_kb,
        "upload_mbps": args.upload_mbps, "seed_upload_mbps": args.seed_upload_mbps,
        "t_swarm_s": round(swarm["t"], 3), "t_min_s": round(t_min, 3),
        "t_swarm_over_t_min": round(swarm["t"] / t_min, 3),
        "t_single_origin_s": round(single["t"], 3) if single else None,
        "single_origin_over_swarm": round(single["t"] / swarm["t"], 3) if single else None,
        "seed_upload_ratio": round(swarm["seed_upload_bytes"] / file_bytes, 3),
        "all_verified": swarm["verified"] and (single is None or single["verified"]),
        "peer_max_rss_mb": swarm["max_rss_mb"],
    }
    print(json.dumps(result))
    return 0
