"""`swarm bench broadcast`: a seed and N real peers (separate `swarm` processes on loopback) share one policy.

What is measured, in one run so the ratios are fair on a noisy machine:
- t_swarm_s: from the publisher's announcement to the last peer holding every verified piece, peers re-seeding;
- t_single_origin_s: the same peers and caps, each fetching from the seed alone (`--no-reseed`);
- t_min_s: the Kumar-Ross bound max(F/U0, N*F/(U0 + N*u)) for those caps;
- seed_upload_ratio: bytes the seed uploaded (its own counter, reported after the last peer completed) / file size;
- all_verified: after the peers exit, every peer's store is reassembled and compared (BLAKE3) with the original;
- peer_max_rss_mb: the largest peak RSS of a peer process (seed-only peers never load whole files), with
  peer_upload_mb (what each peer served to the others) and seed_rss_mb (the publishing seed's peak RSS);
- cpu: per phase, the CPU seconds every process spent from the announcement to the last completion (`cpu_s`),
  a peer's CPU per MiB it moved (received plus sent; `peer_ms_per_mib`, the mean over peers) and the seed's per MiB
  it sent (`seed_ms_per_mib`). Why: uncapped on one machine, CPU and not bandwidth is the limit, so CPU per byte
  says what a distribution costs; `idle_cpu_s_per_s` is what all processes spend warm and idle (measured for
  IDLE_WINDOW seconds before the announcement), and `piece_path_ms_per_mib` the phase's CPU less that, per MiB the
  peers moved; `--profile DIR` writes every process's cProfile statistics to find where it goes.
Process start-up is not counted: the publisher announces once every pair of processes holds a warm data channel
(`warm_links` says how many pairs were warm when the clock started; see `_warm_up`). The publisher is this module's
`publisher_main`, `swarm publish` with an announce trigger.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import math
import os
import runpy
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import blake3
import numpy as np
import trio
from safetensors.numpy import save_file

from p2p.identity import Identity, read_key_file, write_key_file
from p2p.pieces.manifest import GenerationSettings, build_manifest, sign_manifest
from p2p.pieces.store import PieceStore
from swarm.bench.broadcast_virtual import VirtualSwarm, run_virtual
from swarm.bench.kumar_ross import min_distribution_time
from swarm.bench.local_ports import free_ports
from swarm.errors import UserError
from swarm.event_types import Published
from swarm.events import EventSink

if TYPE_CHECKING:
    from swarm.node.state import Node


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--peers", type=int, default=8)
    parser.add_argument("--size-mb", dest="size_mb", type=float, default=32)
    parser.add_argument("--upload-mbps", dest="upload_mbps", type=float, default=32, help="each peer's upload cap")
    parser.add_argument("--seed-upload-mbps", dest="seed_upload_mbps", type=float, default=32)
    parser.add_argument("--piece-kb", dest="piece_kb", type=int, default=256)
    parser.add_argument("--no-baseline", dest="baseline", action="store_false", help="skip the single-origin run")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds before a phase is abandoned")
    parser.add_argument("--warmup", type=float, default=60.0,
                        help="seconds to wait for warm data channels between all processes before publishing")
    parser.add_argument("--work-dir", dest="work_dir", type=Path, help="keep files here (default: a temp dir)")
    parser.add_argument("--json", action="store_true", help="print only the JSON result")
    parser.add_argument("--profile", type=Path, help="write each process's cProfile statistics into this folder")
    parser.add_argument("--virtual", action="store_true",
                        help="simulate in virtual time over memnet instead (swarm/bench/broadcast_virtual.py)")
    parser.add_argument("--degree", type=int, default=8,
                        help="--virtual: data links per peer and version (a peer opens links_per_version itself)")
    parser.add_argument("--latency-ms", dest="latency_ms", type=float, default=20.0, help="--virtual: link latency")


def _make_checkpoint(path: Path, size_mb: float) -> bytes:
    """A safetensors file of `size_mb` MiB of random float32 values plus model.json; returns its BLAKE3."""

    path.mkdir(parents=True, exist_ok=True)
    n = max(1, int(size_mb * 2**20 / 4))
    save_file(
        {"weight": np.random.default_rng(0).standard_normal(n, dtype=np.float32)}, str(path / "model.safetensors")
    )
    (path / "model.json").write_text(json.dumps({"architecture": "bench", "tokenizer": "none"}))
    return blake3.blake3((path / "model.safetensors").read_bytes()).digest()


class EventProcess:
    """A child process whose JSON event lines a thread collects as they come.

    Why a thread per process: a child whose stdout pipe is not drained blocks in its next print (and with it its
    whole trio loop, uploads included); reading processes one after another stalls the ones not being read.
    """

    def __init__(self, argv: list[str], log_path: Path, stdin: int | None = None) -> None:
        self.log = open(log_path, "w")
        self.popen = subprocess.Popen([sys.executable, *argv], stdin=stdin, stdout=subprocess.PIPE, stderr=self.log,
                                      text=True, bufsize=1)
        self.seen: list[dict] = []
        self.ended = False
        self._cond = threading.Condition()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.popen.stdout:
            self.log.write(line)
            self.log.flush()
            try:
                event = json.loads(line)
            except ValueError:
                continue
            with self._cond:
                self.seen.append(event)
                self._cond.notify_all()
        with self._cond:
            self.ended = True
            self._cond.notify_all()

    def events(self, kind: str) -> list[dict]:
        with self._cond:
            return [e for e in self.seen if e.get("event") == kind]

    def count_since(self, kinds: tuple[str, ...], since: float) -> int:
        """Events of `kinds` stamped at or after `since`, read from the newest back (events arrive in time order)."""
        with self._cond:
            count = 0
            for event in reversed(self.seen):
                if event.get("t", since) < since:
                    break
                count += event.get("event") in kinds
            return count

    def wait_for(self, kind: str, deadline: float, after: float = -math.inf, **match) -> dict:
        """The first event of `kind`, stamped after `after`, whose fields equal `match`; UserError if the process
        exits or time runs out first."""
        with self._cond:
            while True:
                for event in self.seen:
                    if (event.get("event") == kind and event["t"] > after
                            and all(event.get(k) == v for k, v in match.items())):
                        return event
                if self.ended:
                    raise UserError(f"a benchmark process exited before '{kind}'; see {self.log.name}")
                if not self._cond.wait(timeout=max(0.0, deadline - time.monotonic())):
                    raise UserError(f"no '{kind}' event before the deadline; see {self.log.name}")

    def peak_rss_mb(self) -> float:
        """Peak resident memory of the running process (Linux /proc; 0 where unavailable)."""
        try:
            for line in Path(f"/proc/{self.popen.pid}/status").read_text().splitlines():
                if line.startswith("VmHWM:"):
                    return round(int(line.split()[1]) / 1024, 1)
        except OSError:
            pass
        return 0.0

    def cpu_seconds(self) -> float:
        """User plus system CPU time of the running process so far (Linux /proc; 0 where unavailable)."""
        try:
            fields = Path(f"/proc/{self.popen.pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            return 0.0
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def stop(self) -> None:
        if self.popen.poll() is None:
            self.popen.terminate()
            try:
                self.popen.wait(10)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait()
        self._reader.join(5)
        self.log.close()


def _warm_up(procs: list[EventProcess], deadline: float) -> tuple[int, int]:
    """Wait until every pair of processes holds a warm data channel (a mirror's 'spare' event); returns (pairs
    warm, pairs in all). Why: a run's peers live for many versions, so a new version finds its links open; a
    cold start would measure libp2p start-up (connections, then several seconds per data-channel dial) instead."""
    ids = {p.wait_for("listening", deadline)["peer_id"] for p in procs}
    wanted = len(ids) * (len(ids) - 1) // 2
    while True:
        warm = set()
        for p in procs:
            me = p.events("listening")[0]["peer_id"]
            warm |= {frozenset((me, e["peer"])) for e in p.events("spare") if e["peer"] in ids}
        if len(warm) >= wanted or time.monotonic() > deadline:
            return len(warm), wanted
        time.sleep(0.2)


_PUBLISHER = "import sys; from swarm.bench.broadcast import publisher_main; sys.exit(publisher_main(sys.argv[1:]))"
_PROFILED = "import sys; from swarm.bench.broadcast import profiled_main; sys.exit(profiled_main(sys.argv[1:]))"


def profiled_main(argv: list[str]) -> int:
    """argv: a statistics file, "publisher" or "swarm", then that entry point's arguments, run under cProfile.

    Why CPU time and not cProfile's wall clock: nine processes share the machine's cores, and a function that was
    merely waiting for one would look costly."""
    path, which, *rest = argv
    if which == "publisher":  # `swarm` ends cleanly on SIGTERM; the publisher would die without writing its file
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    sys.argv = ["swarm", *rest]  # what `python -m swarm` reads
    profile = cProfile.Profile(time.process_time)
    try:
        if which == "publisher":
            return profile.runcall(publisher_main, rest)
        return profile.runcall(runpy.run_module, "swarm", run_name="__main__")
    except SystemExit as exit:  # `python -m swarm` ends in sys.exit
        return exit.code if isinstance(exit.code, int) else 1
    finally:
        profile.dump_stats(path)


def publisher_main(argv: list[str]) -> int:
    """The bench's publisher: what `swarm publish` does, except that it announces when told (a line on stdin), so
    the bench can start the clock on a warm swarm. argv: checkpoint, run, key file, data dir, piece KiB, Mbit/s,
    then the multiaddrs to listen on (none: any loopback port)."""
    ckpt, run, key_file, data_dir, piece_kb, upload_mbps, *listen = argv
    return run_publisher(ckpt, run, key_file, data_dir, int(piece_kb), float(upload_mbps), listen=tuple(listen))


def run_publisher(ckpt: str, run: str, key_file: str, data_dir: str, piece_kb: int, upload_mbps: float,
                  listen: tuple[str, ...]) -> int:
    """A seed-only peer that publishes the checkpoint as version 1 of `run` once a line arrives on stdin."""

    from swarm.config import load_config
    from swarm.node.node import open_node_parts

    key = read_key_file(Path(key_file))
    config = load_config(None, {"roles": ("seed",), "run": run, "data_dir": Path(data_dir), "listen": listen,
                                "bootstrap": (), "upload_mbps": upload_mbps, "piece_kb": piece_kb,
                                "trainer_key": key.public_bytes.hex()})
    events = EventSink(json_lines=True)
    events.configure_logging()

    async def publish(node: Node) -> None:
        manifest = build_manifest(Path(ckpt), run=run, version=1, parent_version=None, created_at=time.time(),
                                  generation=GenerationSettings(8, 0.6, 256, 0), piece_size=piece_kb * 1024)
        signed = sign_manifest(manifest, key.sign, key.public_bytes).to_bytes()
        await trio.wrap_file(sys.stdin).readline()
        node.mirror.adopt(signed, local_dir=Path(ckpt))
        events.emit(Published(version=1, id=manifest.id.hex(), bytes=manifest.total_size))
        await node.announce_policy(signed, manifest)

    return trio.run(open_node_parts, config, key, events, [publish], key.public_bytes)


@dataclass(frozen=True)
class PeerArgs:
    """What the peers' command lines take of a bench's arguments (`swarm bench broadcast`'s, or another bench's:
    swarm.bench.sybil_links): a type, so a bench cannot leave one out."""

    upload_mbps: float
    profile: Path | None = None  # write each process's cProfile statistics into this folder


def _entry(args: PeerArgs, name: str, which: str) -> list[str]:
    """The interpreter arguments that run `which` ("publisher" or "swarm") under `profiled_main`."""
    return ["-c", _PROFILED, str(args.profile / f"{name}.prof"), which]


def _phase(work: Path, args: argparse.Namespace, key_hex: str, reseed: bool) -> dict:
    """One distribution: peers stay up and keep re-seeding until the LAST one holds every piece.

    Why peers do not exit on completion: a finished peer that leaves stops uploading, so the stragglers fall back on
    the seed (measured: 2.5x the file uploaded by the seed, 3x the bound); the bound assumes every peer uploads
    until the distribution is over, and so do the peers of a run.
    """
    tag = "swarm" if reseed else "single"
    start_deadline = time.monotonic() + args.timeout
    seed_port, *ports = free_ports(args.peers + 1)  # all at once: each process its own
    seed_listen = f"/ip4/127.0.0.1/tcp/{seed_port}"
    seed_addr = f"{seed_listen}/p2p/{read_key_file(work / 'trainer.key').peer_id}"
    peer_args = PeerArgs(args.upload_mbps, args.profile)
    script = _entry(peer_args, f"{tag}-seed", "publisher") if args.profile else ["-c", _PUBLISHER]
    pub = EventProcess([*script, str(work / "ckpt"), f"bench-{tag}", str(work / "trainer.key"),
                        str(work / f"{tag}-seed"), str(args.piece_kb), str(args.seed_upload_mbps), seed_listen],
                       work / f"{tag}-seed.log", stdin=subprocess.PIPE)
    peers: list[EventProcess] = []
    try:
        for i, argv in enumerate(_peer_argvs(work, peer_args, tag, key_hex, seed_addr, reseed, ports)):
            peers.append(EventProcess(argv, work / f"{tag}-peer{i}.log"))
        for p in [pub] + peers:
            p.wait_for("listening", start_deadline)
        warm = _warm_up([pub] + peers, time.monotonic() + args.warmup)
        idle = _idle_cpu([pub] + peers)
        cpu_before = [p.cpu_seconds() for p in [pub] + peers]
        pub.popen.stdin.write("go\n")
        pub.popen.stdin.flush()
        published = pub.wait_for("published", time.monotonic() + args.timeout)
        deadline = time.monotonic() + args.timeout
        done = [p.wait_for("complete", deadline, id=published["id"]) for p in peers]
        cpu = [after - before for after, before in zip([p.cpu_seconds() for p in [pub] + peers], cpu_before)]
        t_done = max(d["t"] for d in done)
        # the seed's own counter, from its first progress report after the last peer completed
        seed_report = pub.wait_for("progress", deadline, after=t_done, version=published["version"])
        # what each peer served by then: the memory figure must cover serving, not only fetching
        reports = [p.wait_for("progress", deadline, after=t_done, version=published["version"]) for p in peers]
        rss = max(p.peak_rss_mb() for p in peers)
        seed_rss = pub.peak_rss_mb()
    finally:
        for p in peers + [pub]:
            p.stop()
    return {
        "t": t_done - published["t"],
        "seed_upload_bytes": seed_report["up_bytes"],
        "max_rss_mb": rss,
        "seed_rss_mb": seed_rss,
        "peer_upload_bytes": [r["up_bytes"] for r in reports],
        "warm": warm,
        "cpu": {**_cpu_figures(cpu, seed_report["up_bytes"], reports), "idle_cpu_s_per_s": idle,
                "piece_path_ms_per_mib": _piece_path_ms(cpu, idle * (t_done - published["t"]), reports)},
        "manifest_id": published["id"],
        "verified": _verify(work, tag, args.peers, published["id"]),
    }


IDLE_WINDOW = 2.0
"""Seconds a warm swarm is watched idle before the announcement, to tell the piece path's CPU from the rest."""


def _idle_cpu(procs: list[EventProcess]) -> float:
    """CPU seconds per second all `procs` together spend while warm and idle (heartbeats, gossip, DHT)."""
    before = sum(p.cpu_seconds() for p in procs)
    time.sleep(IDLE_WINDOW)
    return round((sum(p.cpu_seconds() for p in procs) - before) / IDLE_WINDOW, 3)


def _piece_path_ms(cpu: list[float], idle_cpu: float, reports: list[dict]) -> float:
    """CPU per MiB moved by the peers (received plus sent) over all processes, less what they spend idle."""
    moved = sum(r["up_bytes"] + r["down_bytes"] for r in reports) / 2**20
    return round(1000 * max(0.0, sum(cpu) - idle_cpu) / max(moved, 1e-9), 2)


def _cpu_figures(cpu: list[float], seed_up: int, reports: list[dict]) -> dict:
    """A phase's CPU (`cpu`: the seed's seconds, then each peer's) per MiB moved; see the module docstring."""
    moved = [(r["up_bytes"] + r["down_bytes"]) / 2**20 for r in reports]
    per_peer = [1000 * seconds / mib for seconds, mib in zip(cpu[1:], moved) if mib]
    return {"cpu_s": round(sum(cpu), 2), "peer_ms_per_mib": round(sum(per_peer) / max(1, len(per_peer)), 2),
            "seed_ms_per_mib": round(1000 * cpu[0] / max(seed_up / 2**20, 1e-9), 2)}


def _peer_argvs(work: Path, args: PeerArgs, tag: str, key_hex: str, seed_addr: str, reseed: bool,
                ports: list[int]) -> list[list[str]]:
    """Every peer's command line, addresses chosen first: each peer has its own key and port (`ports`, one per
    peer, distinct), and bootstraps from the seed and from every peer before it (a tracker's peer list), so the
    swarm is fully connected without waiting for heartbeat discovery, and only one of each pair dials. Why chosen
    first: then every process starts at once; one after another, their start-ups (each a Python process importing
    the node) add up to minutes on a loaded machine."""
    known = [seed_addr]
    argvs = []
    for i, port in enumerate(ports):
        key_file = work / f"{tag}-peer{i}.key"
        identity = Identity.generate()
        write_key_file(key_file, identity)
        entry = _entry(args, f"{tag}-peer{i}", "swarm") if args.profile else ["-m", "swarm"]
        argvs.append([*entry, "peer", "start", "--role", "seed", "--run", f"bench-{tag}",
                      "--trainer-key", key_hex, "--data-dir", str(work / f"{tag}-peer{i}"),
                      "--upload-mbps", str(args.upload_mbps),
                      "--identity-key", str(key_file), "--listen", f"/ip4/127.0.0.1/tcp/{port}", "--json",
                      *[f for addr in known for f in ("--bootstrap", addr)], *([] if reseed else ["--no-reseed"])])
        known.append(f"/ip4/127.0.0.1/tcp/{port}/p2p/{identity.peer_id}")
    return argvs


def _verify(work: Path, tag: str, peers: int, manifest_hex: str) -> bool:
    """Reassemble every peer's copy from its store and compare it with the original file."""

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


def run_virtual_bench(args: argparse.Namespace) -> int:
    """`--virtual`: the same broadcast in virtual time, every peer a real SwarmService on memnet."""
    if args.degree < 2 or args.latency_ms < 0 or not 256 <= args.piece_kb <= 4096:
        raise UserError("--degree must be at least 2, --latency-ms not negative, --piece-kb within 256..4096")
    shape = VirtualSwarm(peers=args.peers, degree=args.degree, seed_upload_bps=args.seed_upload_mbps * 1e6 / 8,
                         peer_upload_bps=args.upload_mbps * 1e6 / 8, latency=args.latency_ms / 1000)
    started = time.process_time()
    with tempfile.TemporaryDirectory(prefix="swarm-bench-") as tmp:
        result = run_virtual(int(args.size_mb * 2**20), shape, Path(args.work_dir or tmp), args.piece_kb * 1024)
    done = sorted(result.completion_seconds.values())
    print(json.dumps({
        "virtual": True, "peers": args.peers, "degree": args.degree, "size_mb": args.size_mb,
        "piece_kb": args.piece_kb, "upload_mbps": args.upload_mbps, "seed_upload_mbps": args.seed_upload_mbps,
        "latency_ms": args.latency_ms, "t_swarm_s": round(result.seconds, 3), "t_min_s": round(result.bound_seconds, 3),
        "t_swarm_over_t_min": round(result.ratio, 3), "t_median_peer_s": round(done[len(done) // 2], 3),
        "seed_upload_ratio": round(result.seed_upload_ratio, 3), "all_verified": len(done) == args.peers,
        "cpu_s": round(time.process_time() - started, 1),
    }))
    return 0


def run(args: argparse.Namespace) -> int:
    if args.peers < 1 or args.size_mb <= 0 or args.upload_mbps <= 0 or args.seed_upload_mbps <= 0:
        raise UserError("peers, size and upload caps must be positive")
    if args.virtual:
        return run_virtual_bench(args)
    with tempfile.TemporaryDirectory(prefix="swarm-bench-") as tmp:
        work = args.work_dir or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        if args.profile:
            args.profile.mkdir(parents=True, exist_ok=True)
        _make_checkpoint(work / "ckpt", args.size_mb)
        key = Identity.generate()
        if not (work / "trainer.key").exists():
            write_key_file(work / "trainer.key", key)
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
        "peer_upload_mb": [round(b / 2**20, 1) for b in swarm["peer_upload_bytes"]],
        "seed_rss_mb": swarm["seed_rss_mb"],
        "warm_links": "{}/{}".format(*swarm["warm"]),
        "cpu_swarm": swarm["cpu"],
        "cpu_single_origin": single["cpu"] if single else None,
    }
    print(json.dumps(result))
    return 0
