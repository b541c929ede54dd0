"""`swarm bench scale`: what one peer's protocol costs as the run grows, measured on loopback, estimated at 1,000.

Separate processes, as `swarm bench broadcast` runs them: a publisher that signs and announces a new policy version
when told (what a trainer does between steps), and light seed-only peers, each a `swarm` node with its own host,
gossip, DHT and mirror, run as `swarm peer start` runs one (its start-up objects frozen out of the garbage
collector's full collections, swarm.node.gc_warmup). The swarm grows in steps (8, 16, 32, 64 peers by default: new
peers join the running ones), and at each size, once every peer holds the newest version, the joiners' data
channels have settled (fewer than two opened per peer in 10 s) and `--settle` seconds have passed, every peer is
measured over three windows of `--window` seconds: an idle one, in which no version is published (heartbeats,
gossip upkeep, DHT upkeep, data-channel upkeep); a chatty one, in which every peer also sends a heartbeat every 6 s
(what a flooded message costs each peer, with its duplicates and forwards); then one in which a version is
published every `--version-every` seconds. Per window and peer:

- cpu_share: CPU seconds (user + system, /proc/<pid>/stat) per wall second: one core is 1.0;
- rss_mb: resident memory (/proc/<pid>/status VmRSS);
- gossip_delivered_per_s: gossip messages handed to the node (its own GossipStats, reported as an event);
- recv_kb_per_s / sent_kb_per_s: TCP payload bytes its sockets received and sent (`ss -tinp` counters, per
  connection open at the window's end; one that closed within the window is not counted);
- payload_kb_per_s: of those, the policy's pieces it downloaded and uploaded (its progress events); the idle,
  chatty and version byte figures below are protocol bytes, the sockets' bytes less these;
- sockets: open socket descriptors (connections, listeners, the data channel's);
- peers_known: peers the node heard heartbeats from; connected: peers it holds a connection to.

The estimate at 1,000 peers has two parts, because they grow with different things:
- upkeep: a cost per gossip delivery (the chatty window's extra CPU and bytes over the idle one, per extra
  delivery), times the deliveries at 1,000 (the heartbeats a virtual-time run of the real heartbeat loop counts,
  swarm.bench.heartbeat_sim, plus the measured non-heartbeat traffic); plus what is left of the idle windows, a
  fixed part and a part per connection (least squares over the sizes), at the connections a peer holds at 1,000
  (`max_peers` plus the trimming slack: p2p.host.conn_trim closes the unused ones past that; more where the largest
  size already held more, since connections in use are never trimmed);
- versions, from the difference of the publishing and idle windows: CPU and bytes per version per data link (a
  version is fetched and served over data links, counted from the mirror's link events), times the links a peer
  opens per version at 1,000 (what the largest size measured where the links_per_version setting bound it, else
  one per other peer up to max_peers), times the version rate; each size's publishing window less the heartbeats
  it held more (or fewer) of than the idle one, at the chatty windows' price per delivery (heartbeats are drawn
  at random times, and upkeep prices them). The peers announce versions on the DHT as often as
  a peer of the 1,000-peer run would (`providers_as_at`): in a small run every peer announces every version, a
  DHT lookup and stores a version that a peer of a large run pays about once in 50 versions.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import trio

from p2p.errors import P2PError
from p2p.host.conn_trim import TrimConfig
from p2p.identity import Identity, read_key_file, write_key_file
from p2p.pieces.manifest import GenerationSettings, build_manifest, sign_manifest
from swarm.bench.broadcast import EventProcess, _make_checkpoint
from swarm.bench.heartbeat_sim import run_heartbeat_sim
from swarm.bench.scale_measure import measure, wait_links_settled, wait_synced
from swarm.config import DHT_PROVIDERS_WANTED, LimitsSection, MirrorSection, load_config
from swarm.errors import UserError
from swarm.event_types import ChatterFailed, GossipStats, Published
from swarm.events import EventSink
from swarm.node.gc_warmup import run_freezing_after_warmup
from swarm.node.gossip import heartbeat_body
from swarm.node.node import open_node_parts
from swarm.node.state import Node

BUDGET_CPU_SHARE = 0.02
CHATTER_EVERY_S = 6.0
"""A peer's extra heartbeats in the chatty window: one per 6 s on average, the unstretched period."""
BUDGET_BYTES_PER_S = 100_000
GAUGES_EVERY = 5
"""Seconds between two looks at a bench peer's connections and mesh sizes (`report_gossip`)."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--sizes", default="8,16,32,64", help="swarm sizes measured, in growing order")
    parser.add_argument("--window", type=float, default=20.0,
                        help="seconds of each of the three windows (idle, chatty, publishing) measured at each size")
    parser.add_argument("--settle", type=float, default=15.0, help="seconds after the swarm settles before measuring")
    parser.add_argument("--version-every", dest="version_every", type=float, default=20.0,
                        help="seconds between the publisher's policy versions in the publishing window")
    parser.add_argument("--estimate-peers", dest="estimate_peers", type=int, default=1000)
    parser.add_argument("--links-per-version", dest="links_per_version", type=int,
                        default=MirrorSection().links_per_version,
                        help="data links each peer opens per version (the peer setting of that name)")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds a peer may take to start")
    parser.add_argument("--work-dir", dest="work_dir", type=Path, help="keep files here (default: a temp dir)")
    parser.add_argument("--json", action="store_true", help="print only the JSON result")


_PUBLISHER = "import sys; from swarm.bench.scale import publisher_main; sys.exit(publisher_main(sys.argv[1:]))"
_PEER = "import sys; from swarm.bench.scale import peer_main; sys.exit(peer_main(sys.argv[1:]))"


def _node_config(run: str, data_dir: str, bootstrap: list[str], trainer_key: str, links_per_version: int,
                 dht_providers: float = DHT_PROVIDERS_WANTED):
    return load_config(None, {"roles": ("seed",), "run": run, "data_dir": Path(data_dir),
                              "bootstrap": tuple(bootstrap), "trainer_key": trainer_key, "piece_kb": 256,
                              "links_per_version": links_per_version, "dht_providers": dht_providers,
                              # every peer is on 127.0.0.1: the per-IP cap on data sockets awaiting their token
                              # (one stranger's) would refuse honest peers, as no run with their own IPs does
                              "data_exempt_loopback": True})


def providers_as_at(target: int, largest: int) -> float:
    """The peers' `dht_providers` setting: at the largest size measured, each peer announces a version on the DHT
    as often as a peer of a `target`-peer run does (DHT_PROVIDERS_WANTED / (target + 1)), so the versions' cost is
    the one a peer pays there; at smaller sizes more often, which errs high."""
    return DHT_PROVIDERS_WANTED * (largest + 1) / (target + 1)


async def report_gossip(node: Node) -> None:
    """A role task of the bench's processes: the node's gossip counters and mean mesh size (peers per topic whose
    messages each delivery is forwarded to), looked at every second and emitted as an event when they changed.
    Why only then: the bench reads the newest event, which is still exact, and the event itself (a JSON line and
    the node's listeners) costs about 3 % of what an idle peer of 64 spends when it goes out every second. The
    connections and mesh sizes, which list every connected peer, are looked at every GAUGES_EVERY seconds only: the
    counters are read each second, since the windows' rates are taken from them."""
    last: dict = {}
    for second in itertools.count():
        if second % GAUGES_EVERY == 0:  # a peer's connections and meshes, listed: the costly part, and gauges
            gauges = {"connected": len(node.connected_peers()), "mesh": round(node.gossip.mean_mesh_size(), 3)}
        stats = {"delivered": node.gossip.stats.delivered, "published": node.gossip.stats.published,
                 "peers_known": len(node.peer_heard), **gauges}
        if stats != last:
            node.events.emit(GossipStats(**stats))
            last = stats
        await trio.sleep(1.0)


def publisher_main(argv: list[str]) -> int:
    """The publisher: a seed holding the trainer key that announces version 1 at once, then the next version for
    each line on stdin (the bench paces them). argv: checkpoint dir, run, key file, data dir, links per version."""
    ckpt, run, key_file, data_dir, links = argv
    key = read_key_file(Path(key_file))
    events = EventSink(json_lines=True)
    events.configure_logging()

    async def publish(node: Node) -> None:
        lines = trio.wrap_file(sys.stdin)
        for version in range(1, 1_000_000):
            manifest = build_manifest(Path(ckpt), run=run, version=version, parent_version=version - 1 or None,
                                      created_at=time.time(), generation=GenerationSettings(8, 0.6, 256, 0),
                                      piece_size=256 * 1024)
            signed = sign_manifest(manifest, key.sign, key.public_bytes).to_bytes()
            node.mirror.adopt(signed, local_dir=Path(ckpt))
            await node.announce_policy(signed, manifest)
            events.emit(Published(version=version))
            if not await lines.readline():
                await trio.sleep_forever()  # the bench closed our stdin: keep serving until it stops us

    config = _node_config(run, data_dir, [], key.public_bytes.hex(), int(links))
    return trio.run(run_freezing_after_warmup, open_node_parts, config, key, events, [publish, report_gossip],
                    key.public_bytes)


def peer_main(argv: list[str]) -> int:
    """A light seed-only peer that also reports its gossip counters. argv: run, trainer key hex, data dir, links per
    version, DHT providers setting, bootstrap multiaddrs..."""
    run, key_hex, data_dir, links, providers, *bootstrap = argv
    events = EventSink(json_lines=True)
    events.configure_logging()
    config = _node_config(run, data_dir, bootstrap, key_hex, int(links), float(providers))
    return trio.run(run_freezing_after_warmup, open_node_parts, config, Identity.generate(), events,
                    [report_gossip, chatter_when_told], bytes.fromhex(key_hex))


async def chatter_when_told(node: Node) -> None:
    """A role task of the bench's peers: from a "chatter" line on stdin to a "quiet" one, also send a heartbeat
    every CHATTER_EVERY_S on average (within what receivers admit from one peer), so the bench can price what a
    flooded message costs every peer."""
    stdin = trio.lowlevel.FdStream(os.dup(sys.stdin.fileno()))  # cancellable, unlike a thread blocked in readline
    chatter = trio.CancelScope()
    pending = b""
    async with trio.open_nursery() as nursery:
        while data := await stdin.receive_some():
            pending += data
            while b"\n" in pending:
                line, pending = pending.split(b"\n", 1)
                if line.strip() == b"chatter":
                    chatter = trio.CancelScope()
                    nursery.start_soon(_chatter, node, chatter)
                elif line.strip() == b"quiet":
                    chatter.cancel()
        await trio.sleep_forever()  # the bench closed our stdin: go on serving until it stops us


async def _chatter(node: Node, scope: trio.CancelScope) -> None:
    with scope:
        await trio.sleep(CHATTER_EVERY_S * random.random())  # peers are told at once: spread their sends
        while True:
            try:
                await node.gossip.publish("heartbeat", heartbeat_body(node))
            except P2PError as exc:
                node.events.emit(ChatterFailed(error=str(exc)))
            await trio.sleep(CHATTER_EVERY_S)


def _summary(n: int, idle: list[dict], publishing: list[dict], window: float, chatty: list[dict] | None = None) -> dict:
    """One size's row: the publishing window's means (and maxima), the idle and chatty windows' CPU, bytes,
    deliveries and connections, and what one version costs a peer on top of upkeep: the publishing window's extra
    over the idle one, spread over the versions published in its `window` seconds (not one per `--version-every`:
    a window shorter than that, or not a multiple of it, holds fewer seconds per version); and the gossip
    deliveries per version the publishing window had past the idle one's and the versions' own announcements
    (heartbeats are drawn at random times, so two windows hold different numbers of them), which `estimate` takes
    back out of a version's CPU at their price."""
    per_version_s = window / max(1, publishing[0]["versions"])

    def mean(rows: list[dict], key: str) -> float:
        return round(sum(r[key] for r in rows) / len(rows), 4)

    def kb(rows: list[dict]) -> float:  # protocol bytes: what the sockets moved less the policy's pieces
        return max(0.0, mean(rows, "recv_kb_per_s") + mean(rows, "sent_kb_per_s") - mean(rows, "payload_kb_per_s"))

    extra_cpu_share = mean(publishing, "cpu_share") - mean(idle, "cpu_share")
    return {"peers": n, **{k: mean(publishing, k) for k in publishing[0]},
            "cpu_share_max": round(max(r["cpu_share"] for r in publishing), 4),
            "rss_mb_max": round(max(r["rss_mb"] for r in publishing), 1),
            "idle_cpu_share": mean(idle, "cpu_share"),
            "idle_gossip_delivered_per_s": mean(idle, "gossip_delivered_per_s"),
            "idle_kb_per_s": round(kb(idle), 4), "idle_connected": mean(idle, "connected"),
            **({"chatty_cpu_share": mean(chatty, "cpu_share"),
                "chatty_gossip_delivered_per_s": mean(chatty, "gossip_delivered_per_s"),
                "chatty_kb_per_s": round(kb(chatty), 4)} if chatty else {}),
            "version_cpu_s": round(max(0.0, extra_cpu_share) * per_version_s, 4),
            "version_extra_cpu_s": round(extra_cpu_share * per_version_s, 4),
            "version_other_deliveries": round((mean(publishing, "gossip_delivered_per_s")
                                               - mean(idle, "gossip_delivered_per_s")) * per_version_s - 1, 3),
            "version_kb": round(max(0.0, kb(publishing) - kb(idle)) * per_version_s, 2)}


def _fit(xs: list[float], ys: list[float]) -> tuple[float, float]:
    """Least-squares (intercept, slope) of ys over xs; slope 0 when xs do not vary."""
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    var = sum((x - mx) ** 2 for x in xs)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / var if var > 0 else 0.0
    return my - slope * mx, max(0.0, slope)


def estimate(sizes: list[dict], heartbeats_per_peer_s: dict[int, float], target: int, every: float,
             max_links: int, max_connections: int | None = None) -> dict:
    """Per-peer cost at `target` peers: upkeep (a cost per delivery, priced by the chatty windows, times the
    deliveries there: the measured non-heartbeat traffic plus the heartbeats the virtual-time run counts at that
    size; plus a fixed part and a part per connection, fitted on what the idle windows leave, at the connections a
    peer holds there: `max_connections` (default `max_links`), or what the largest size held if that was more, as
    connections in use stay past the bound) plus versions (the cost per version per data
    link, times the links a peer opens per version there, at most `max_links`, one version every `every` seconds;
    less, per size, the price of the deliveries its publishing window had past the idle one's and the versions'
    own announcements: heartbeats, which the upkeep part prices, not the versions)."""
    cpu_per = _per_delivery(sizes, "cpu_share", 1.0)
    bytes_per = _per_delivery(sizes, "kb_per_s", 1000.0)
    conns = [s["idle_connected"] for s in sizes]
    idle = [(s["idle_cpu_share"], s["idle_kb_per_s"] * 1000, s["idle_gossip_delivered_per_s"]) for s in sizes]
    cpu0, cpu_conn = _fit(conns, [cpu - cpu_per * d for cpu, _, d in idle])
    bytes0, bytes_conn = _fit(conns, [traffic - bytes_per * d for _, traffic, d in idle])
    largest = sizes[-1]
    other = max(0.0, largest["idle_gossip_delivered_per_s"] - heartbeats_per_peer_s[largest["peers"]])
    deliveries = other + heartbeats_per_peer_s[target]
    bound = max_links if max_connections is None else max_connections
    connections = round(min(target - 1, max(bound, largest["idle_connected"])), 2)
    links = sum(max(1.0, s["links_per_version"]) for s in sizes)
    cpu_link = sum(_version_cpu(s, cpu_per) for s in sizes) / links
    cpu_link_uncorrected = sum(s["version_cpu_s"] for s in sizes) / links
    bytes_link = sum(s["version_kb"] * 1000 for s in sizes) / links
    links_there = _links_at(largest, target, max_links)
    upkeep_cpu = cpu0 + cpu_conn * connections + cpu_per * deliveries
    upkeep_bytes = bytes0 + bytes_conn * connections + bytes_per * deliveries
    version_cpu, version_bytes = cpu_link * links_there / every, bytes_link * links_there / every
    cpu, traffic = upkeep_cpu + version_cpu, upkeep_bytes + version_bytes
    return {"peers": target, "gossip_delivered_per_s": round(deliveries, 3),
            "heartbeats_received_per_s": round(heartbeats_per_peer_s[target], 3), "connections": connections,
            "cpu_share": round(cpu, 4), "bytes_per_s": round(traffic),
            "upkeep_cpu_share": round(upkeep_cpu, 4), "upkeep_bytes_per_s": round(upkeep_bytes),
            "version_cpu_share": round(version_cpu, 4), "version_bytes_per_s": round(version_bytes),
            "cpu_s_per_delivery": round(cpu_per, 6), "bytes_per_delivery": round(bytes_per),
            "fixed_cpu_share": round(cpu0, 4), "fixed_bytes_per_s": round(bytes0),
            "cpu_share_per_connection": round(cpu_conn, 5), "bytes_per_s_per_connection": round(bytes_conn),
            "version_cpu_s_per_link": round(cpu_link, 5), "version_bytes_per_link": round(bytes_link),
            "version_cpu_s_per_link_uncorrected": round(cpu_link_uncorrected, 5),
            "links_per_version": links_there, "version_every_s": every,
            "within_budget": cpu < BUDGET_CPU_SHARE and traffic < BUDGET_BYTES_PER_S}


def _version_cpu(size: dict, cpu_per_delivery: float) -> float:
    """CPU seconds a version cost each peer at `size`: the publishing window's extra over the idle one, less the
    deliveries it had past the idle window's and the versions' announcements, at `cpu_per_delivery`. Why: at 32
    peers the peers forwarded 1.7 heartbeats a second in one idle window and 0.7 in the publishing window after it,
    which made the versions look cheaper than nothing; the reverse makes them look dear. Never below nothing."""
    extra = size.get("version_extra_cpu_s", size["version_cpu_s"])
    return max(0.0, extra - cpu_per_delivery * size.get("version_other_deliveries", 0.0))


def _per_delivery(sizes: list[dict], key: str, scale_by: float) -> float:
    """What one more gossip delivery a second costs a peer in `key` (CPU share, or kB/s times `scale_by`): the
    chatty windows' extra over the idle ones, summed over the sizes whose chatter added deliveries, per extra
    delivery. 0 when none did (a window too short to chatter in)."""
    extra, deliveries = 0.0, 0.0
    for s in sizes:
        more = s.get("chatty_gossip_delivered_per_s", 0.0) - s["idle_gossip_delivered_per_s"]
        if more > 0.05:
            extra += (s[f"chatty_{key}"] - s[f"idle_{key}"]) * scale_by
            deliveries += more
    return max(0.0, extra / deliveries) if deliveries else 0.0


def _links_at(largest: dict, target: int, max_links: int) -> float:
    """Data links a peer opens per version at `target` peers: what the largest size measured when fewer than all
    its neighbours were linked (links_per_version bound it, and that bound does not grow with the swarm), else one
    per other peer up to `max_links`."""
    if largest["links_per_version"] < 0.9 * (largest["peers"] - 1):
        return round(min(largest["links_per_version"], max_links, target - 1), 2)
    return min(target - 1, max_links)


def _grow(work: Path, procs: list[EventProcess], target: int, key_hex: str, addrs: list[str], deadline: float,
          links: int, providers: float):
    """Start peers until `target` run, all at once; each bootstraps from the publisher and the three peers that
    joined last before this step (joining together, as a flash crowd does)."""
    known = [addrs[0], *addrs[1:][-3:]]
    started = []
    for i in range(len(procs) - 1, target):
        argv = ["-c", _PEER, "bench-scale", key_hex, str(work / f"peer{i}"), str(links), str(providers), *known]
        started.append(EventProcess(argv, work / f"peer{i}.log", stdin=subprocess.PIPE))
    procs.extend(started)
    addrs.extend(p.wait_for("listening", deadline)["addrs"][0] for p in started)


def _sim_span(peers: int) -> float:
    """Virtual seconds of warm-up, and then of counting, in the heartbeat run of `peers`: three of the longest
    stretched periods there (peers / 3 times 6 s), at least 600."""
    return max(600.0, 6.0 * peers)


def _tell(procs: list[EventProcess], line: str) -> None:
    """One line to each process's stdin: the publisher's "next" version, the peers' "chatter" and "quiet"."""
    for proc in procs:
        proc.popen.stdin.write(line + "\n")
        proc.popen.stdin.flush()


def run(args: argparse.Namespace) -> int:
    sizes = sorted({int(s) for s in args.sizes.split(",") if s.strip()})
    if not sizes or sizes[0] < 1 or args.window <= 0 or args.settle < 0 or args.version_every <= 0:
        raise UserError("--sizes must list positive peer counts; --window, --settle and --version-every positive")
    measured: list[dict] = []
    providers = providers_as_at(args.estimate_peers, sizes[-1])
    max_peers = LimitsSection().max_peers
    with tempfile.TemporaryDirectory(prefix="swarm-bench-scale-") as tmp:
        work = args.work_dir or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        _make_checkpoint(work / "ckpt", 1)
        key = Identity.generate()
        write_key_file(work / "trainer.key", key)
        pub = EventProcess(["-c", _PUBLISHER, str(work / "ckpt"), "bench-scale", str(work / "trainer.key"),
                            str(work / "publisher"), str(args.links_per_version)], work / "publisher.log",
                           stdin=subprocess.PIPE)
        procs = [pub]

        def publish() -> None:
            _tell([pub], "next")

        try:
            addrs = [pub.wait_for("listening", time.monotonic() + args.timeout)["addrs"][0]]
            for n in sizes:
                _grow(work, procs, n, key.public_bytes.hex(), addrs, time.monotonic() + args.timeout,
                      args.links_per_version, providers)
                wait_synced(procs[1:], pub, time.monotonic() + args.timeout)
                wait_links_settled(procs[1:], time.monotonic() + min(args.timeout, 120.0))
                time.sleep(args.settle)
                idle = measure(procs[1:], args.window)
                _tell(procs[1:], "chatter")
                chatty = measure(procs[1:], args.window)
                _tell(procs[1:], "quiet")
                publishing = measure(procs[1:], args.window, publish, args.version_every)
                measured.append(_summary(n, idle, publishing, args.window, chatty))
                print(json.dumps(measured[-1]), file=sys.stderr, flush=True)  # each size as it is measured
        finally:
            for p in procs:
                p.stop()
    wanted = sorted({*sizes, args.estimate_peers})
    heartbeats = {n: run_heartbeat_sim(n, warmup_s=_sim_span(n), seconds=_sim_span(n), forget_every_s=120.0)
                  .received_per_peer_s for n in wanted}
    result = {"mode": "separate processes on loopback", "version_every_s": args.version_every,
              "window_s": args.window, "sizes": measured,
              "dht_providers": round(providers, 3),
              "heartbeats_received_per_peer_s_virtual": {str(n): round(v, 3) for n, v in heartbeats.items()},
              "estimate": estimate(measured, heartbeats, args.estimate_peers, args.version_every,
                                   max_peers, max_peers + TrimConfig().slack),
              "budget": {"cpu_share": BUDGET_CPU_SHARE, "bytes_per_s": BUDGET_BYTES_PER_S}}
    print(json.dumps(result))
    return 0
