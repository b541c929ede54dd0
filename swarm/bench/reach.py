"""`swarm bench reach`: a policy broadcast in which every downloader is a private peer (Linux network namespaces).

Topology (swarm/bench/netns.py): a public namespace holding the publishing seed, which is also the bootstrap peer
and the relay, and N private namespaces whose peers reach the public one but not each other: firewalled with no route
between them, or (`--nat`, the default) behind their own NAT routers. Every private peer learns it is private
(dial-back), reserves a slot on the relay, announces its relayed address, and fetches and re-seeds pieces; behind
NAT, DCUtR turns relayed connections into direct ones.

Reported: t_s (announcement to the last private peer holding every verified piece), t_min_s (the Kumar-Ross bound
with each private peer's upload capped by what the relay lets through: min(peer cap, relay circuit cap), and the
private peers' uploads together by the relay's total cap), `all_verified` (every private store reassembled and
compared with the original), private_upload_mb (what each private peer served: pieces moving between private
peers), and per private peer how it is connected to each other private peer: "hole-punched" when a TCP connection
to that peer's address exists in its namespace (`ss`; nothing else can open one through the NATs), else "relayed".
Needs root and nftables.
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from p2p.identity import Identity, write_key_file
from p2p.reach.relay_limits import RelayLimits
from swarm.bench.broadcast import EventProcess, _make_checkpoint, _verify, _warm_up, run_publisher
from swarm.bench.kumar_ross import min_distribution_time
from swarm.bench.netns import PUBLIC_IP, Testbed, available, python_argv
from swarm.errors import UserError

RUN = "bench-reach"
PORT = 4001


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--peers", type=int, default=3, help="private peers (one namespace each)")
    parser.add_argument("--size-mb", dest="size_mb", type=float, default=8)
    parser.add_argument("--upload-mbps", dest="upload_mbps", type=float, default=32, help="each peer's upload cap")
    parser.add_argument("--seed-upload-mbps", dest="seed_upload_mbps", type=float, default=32)
    parser.add_argument("--piece-kb", dest="piece_kb", type=int, default=256)
    parser.add_argument("--nat", action=argparse.BooleanOptionalAction, default=True,
                        help="private peers behind NAT routers (else firewalled with no route between them)")
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds before a phase is abandoned")
    parser.add_argument("--warmup", type=float, default=30.0, help="seconds to wait for warm links before publishing")
    parser.add_argument("--work-dir", dest="work_dir", type=Path, help="keep files here (default: a temp dir)")
    parser.add_argument("--json", action="store_true", help="print only the JSON result")


def publisher_main(argv: list[str]) -> int:
    """The public seed: swarm.bench.broadcast's publisher on a given listen address (the public namespace's)."""
    ckpt, key_file, data_dir, piece_kb, upload_mbps, listen = argv
    return run_publisher(ckpt, RUN, key_file, data_dir, int(piece_kb), float(upload_mbps), listen=(listen,))


def connection_kinds(net: Testbed, peers: int) -> dict[str, dict[str, str]]:
    """Per private peer, per other private peer: "hole-punched" when a TCP connection to that peer's public face
    is established in its namespace (only a punched hole lets one through), else "relayed"."""
    kinds: dict[str, dict[str, str]] = {}
    for i in range(1, peers + 1):
        out = net.run(net.private_ns(i), ["ss", "-tnH", "state", "established"]).stdout
        remotes = {line.split()[-1].rsplit(":", 1)[0] for line in out.splitlines() if line.strip()}
        kinds[f"p{i}"] = {f"p{j}": "hole-punched" if net.public_face(j) in remotes else "relayed"
                          for j in range(1, peers + 1) if j != i}
    return kinds


def relay_bound(file_bytes: int, seed_bps: float, peer_bps: float, peers: int) -> float:
    """Kumar-Ross with the relay's caps: each private peer uploads at most min(its cap, a circuit's cap), and all
    of them together at most the relay's total cap (every byte between private peers may cross the relay)."""
    limits = RelayLimits()
    per_peer = min(peer_bps, limits.circuit_bytes_per_s)
    total = limits.total_mbps * 1e6 / 8 if limits.total_mbps else math.inf
    return min_distribution_time(file_bytes, seed_bps, min(per_peer * peers, total) / peers, peers)


def _private_peer(net: Testbed, i: int, work: Path, args: argparse.Namespace, key_hex: str, bootstrap: str):
    flags = ["peer", "start", "--role", "seed", "--run", RUN, "--trainer-key", key_hex, "--data-dir",
             str(work / f"reach-peer{i - 1}"), "--upload-mbps", str(args.upload_mbps), "--json",
             "--listen", f"/ip4/{net.private_ip(i)}/tcp/{PORT}", "--bootstrap", bootstrap]
    return EventProcess(python_argv(net.private_ns(i), "swarm", *flags), work / f"reach-peer{i - 1}.log")


def broadcast(work: Path, args: argparse.Namespace, net: Testbed) -> dict:
    """One distribution to every private peer of `net`; peers stay up until the last one completes."""
    key_hex = json.loads((work / "trainer.pub").read_text())
    pub = EventProcess(python_argv(net.public, "swarm.bench.reach", "publish", str(work / "ckpt"),
                                   str(work / "trainer.key"), str(work / "reach-seed"), str(args.piece_kb),
                                   str(args.seed_upload_mbps), f"/ip4/{PUBLIC_IP}/tcp/{PORT}"),
                       work / "reach-seed.log", stdin=subprocess.PIPE)
    peers = []
    try:
        deadline = time.monotonic() + args.timeout
        bootstrap = pub.wait_for("listening", deadline)["addrs"][0]
        peers = [_private_peer(net, i, work, args, key_hex, bootstrap) for i in range(1, args.peers + 1)]
        addrs = [p.wait_for("listening", deadline)["addrs"] for p in peers]
        warm = _warm_up([pub] + peers, time.monotonic() + args.warmup)
        pub.popen.stdin.write("go\n")
        pub.popen.stdin.flush()
        published = pub.wait_for("published", deadline)
        done = [p.wait_for("complete", deadline, id=published["id"]) for p in peers]
        t_done = max(d["t"] for d in done)
        uploads = [p.wait_for("progress", deadline, after=t_done, version=1)["up_bytes"] for p in peers]
        kinds = connection_kinds(net, args.peers)
    finally:
        for p in peers + [pub]:
            p.stop()
    return {"t": t_done - published["t"], "uploads": uploads, "kinds": kinds, "warm": warm,
            "relayed_addrs": all("/p2p-circuit/" in a[0] for a in addrs),
            "verified": _verify(work, "reach", args.peers, published["id"])}


def run(args: argparse.Namespace) -> int:
    if args.peers < 2 or args.size_mb <= 0 or args.upload_mbps <= 0 or args.seed_upload_mbps <= 0:
        raise UserError("at least 2 private peers, and positive size and upload caps")
    if (why := available()) is not None:
        raise UserError(f"swarm bench reach needs network namespaces: {why}")
    with tempfile.TemporaryDirectory(prefix="swarm-reach-") as tmp:
        work = args.work_dir or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        _make_checkpoint(work / "ckpt", args.size_mb)
        key = Identity.generate()
        write_key_file(work / "trainer.key", key)
        (work / "trainer.pub").write_text(json.dumps(key.public_bytes.hex()))
        file_bytes = (work / "ckpt" / "model.safetensors").stat().st_size
        with Testbed(private=args.peers, nat=args.nat) as net:
            result = broadcast(work, args, net)
    t_min = relay_bound(file_bytes, args.seed_upload_mbps * 1e6 / 8, args.upload_mbps * 1e6 / 8, args.peers)
    punched = sum(k == "hole-punched" for per in result["kinds"].values() for k in per.values())
    print(json.dumps({
        "private_peers": args.peers, "nat": args.nat, "size_mb": args.size_mb, "piece_kb": args.piece_kb,
        "upload_mbps": args.upload_mbps, "seed_upload_mbps": args.seed_upload_mbps,
        "t_s": round(result["t"], 3), "t_min_s": round(t_min, 3), "t_over_t_min": round(result["t"] / t_min, 3),
        "all_verified": result["verified"], "relayed_addresses_announced": result["relayed_addrs"],
        "private_upload_mb": [round(b / 2**20, 2) for b in result["uploads"]],
        "connections": result["kinds"], "hole_punched_ends": punched,
        "private_pair_ends": args.peers * (args.peers - 1), "warm_links": "{}/{}".format(*result["warm"]),
    }))
    return 0


if __name__ == "__main__":
    if sys.argv[1:2] != ["publish"]:
        raise SystemExit("usage: python -m swarm.bench.reach publish CKPT KEY DATA_DIR PIECE_KB MBPS LISTEN")
    sys.exit(publisher_main(sys.argv[2:]))
