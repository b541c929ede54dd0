"""Measuring `swarm bench scale`'s processes from outside: CPU and memory from /proc, TCP bytes from `ss`, gossip
counters and data-channel events from the JSON events each process prints (swarm.bench.broadcast.EventProcess),
and the waits that keep a swarm's joining out of its measured windows."""

from __future__ import annotations

import math
import os
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

from swarm.bench.broadcast import EventProcess

_CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def wait_synced(peers: list[EventProcess], publisher: EventProcess, deadline: float) -> None:
    """Until every peer holds the publisher's newest version. Why: peers that just joined fetch it first, and
    that transfer (tens of kB/s each with 16 joiners) is a version's cost, not upkeep: measured in the idle
    window it makes 32 peers look three times as costly as 16."""
    publisher.wait_for("published", deadline)  # the first version is announced as the publisher starts
    newest = publisher.events("published")[-1]["version"]
    for peer in peers:
        peer.wait_for("complete", deadline, version=newest)


def links_settled(peers: list[EventProcess], now: float, span: float = 10.0) -> bool:
    """Whether the peers opened fewer than two data channels each (spares and links) in the `span` seconds before
    `now`. Why: joiners also dial a spare to each neighbour they learn from heartbeats (at 32 peers, 700 of 1,300
    open 10-30 s after every peer is synced), which an idle window would count as upkeep. Between versions a peer
    renews a spare about every `spare_ttl` / `max_peers` (15 s by default), well below this."""
    opened = sum(peer.count_since(("spare", "link"), now - span) for peer in peers)
    return opened < 2 * len(peers)


def wait_links_settled(peers: list[EventProcess], deadline: float, clock: Callable[[], float] = time.monotonic,
                       sleep: Callable[[float], None] = time.sleep) -> bool:
    """Until `links_settled`, checked every second; False if `deadline` (of `clock`) comes first."""
    while clock() < deadline:
        if links_settled(peers, clock()):
            return True
        sleep(1.0)
    return False


Listing = dict[int, dict[str, tuple[int, int]]]
"""pid -> {connection (local and remote address): (bytes sent, bytes received)}."""


def socket_bytes() -> Listing:
    """Each process's TCP connections and their byte counters, from one `ss -tinpH` listing."""
    try:
        text = subprocess.run(["ss", "-tinpH"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        return {}
    listing: Listing = {}
    pid, connection = None, ""
    for line in text.splitlines():
        if "pid=" in line:
            pid = int(line.split("pid=", 1)[1].split(",", 1)[0])
            connection = " ".join(line.split()[3:5])
            continue
        if pid is None:
            continue
        fields = dict(f.split(":", 1) for f in line.split() if f.startswith(("bytes_sent:", "bytes_received:")))
        counts = (int(fields.get("bytes_sent", 0)), int(fields.get("bytes_received", 0)))
        listing.setdefault(pid, {})[connection] = counts
        pid = None
    return listing


def bytes_moved(before: dict[str, tuple[int, int]], after: dict[str, tuple[int, int]]) -> tuple[int, int]:
    """(sent, received) between two listings of one process: each connection open at the second counts what it
    moved since the first (all of it when it opened in between). Why per connection: summed over the process, a
    connection that closed in between (a dropped version's data links) takes its whole count with it, and a window
    in which versions come and go would measure less than nothing."""
    sent = received = 0
    for connection, (s1, r1) in after.items():
        s0, r0 = before.get(connection, (0, 0))
        sent, received = sent + max(0, s1 - s0), received + max(0, r1 - r0)
    return sent, received


def payload_bytes(proc: EventProcess, since: float, until: float) -> int:
    """Piece bytes (up and down) the process's versions moved between `since` and `until`, from its progress
    events (each version's running totals, every `status_every_s`): the policy itself, not protocol overhead."""
    before: dict[int, int] = {}
    after: dict[int, int] = {}
    for event in proc.events("progress"):
        table = before if event["t"] < since else after if event["t"] <= until else None
        if table is not None:
            moved = event["up_bytes"] + event["down_bytes"]
            table[event["version"]] = max(table.get(event["version"], 0), moved)
    return sum(max(0, moved - before.get(version, 0)) for version, moved in after.items())


class _Sample:
    """/proc and socket counters of one process at one moment, plus its latest gossip counters."""

    def __init__(self, proc: EventProcess, listing: Listing) -> None:
        pid = proc.popen.pid
        self.t = time.monotonic()
        stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        self.cpu_s = (int(stat[11]) + int(stat[12])) / _CLK_TCK
        self.connections = listing.get(pid, {})
        status = Path(f"/proc/{pid}/status").read_text()
        self.rss_mb = next(int(line.split()[1]) / 1024 for line in status.splitlines() if line.startswith("VmRSS:"))
        self.sockets = sum(os.readlink(f"/proc/{pid}/fd/{fd}").startswith("socket:")
                           for fd in os.listdir(f"/proc/{pid}/fd") if _is_link(f"/proc/{pid}/fd/{fd}"))
        stats = proc.events("gossip_stats")
        self.gossip = stats[-1] if stats else {"delivered": 0, "peers_known": 0, "connected": 0}


def _is_link(path: str) -> bool:
    try:
        os.readlink(path)
    except OSError:
        return False
    return True


def measure(procs: list[EventProcess], window: float, publish: Callable[[], None] | None = None,
             every: float = math.inf) -> list[dict]:
    """Each process's counters over `window` seconds, calling `publish` at its start and every `every` seconds."""
    listing = socket_bytes()
    before = [_Sample(p, listing) for p in procs]
    start = time.monotonic()
    end, versions = start + window, 0
    while (left := end - time.monotonic()) > 0:
        if publish is not None:
            publish()
            versions += 1
        time.sleep(min(every, left))
    listing = socket_bytes()
    rows = []
    for proc, a in zip(procs, before):
        b = _Sample(proc, listing)
        dt = b.t - a.t
        sent, received = bytes_moved(a.connections, b.connections)
        links = sum(start <= e["t"] <= b.t for e in proc.events("link"))  # one per data link a version opened
        rows.append({"cpu_share": (b.cpu_s - a.cpu_s) / dt, "rss_mb": b.rss_mb,
                     "links_per_version": links / versions if versions else 0.0,
                     "gossip_delivered_per_s": (b.gossip["delivered"] - a.gossip["delivered"]) / dt,
                     "recv_kb_per_s": received / dt / 1000, "sent_kb_per_s": sent / dt / 1000,
                     "payload_kb_per_s": payload_bytes(proc, a.t, b.t) / dt / 1000,
                     "sockets": b.sockets, "peers_known": b.gossip["peers_known"], "connected": b.gossip["connected"],
                     "mesh": b.gossip.get("mesh", 0.0),
                     "versions": versions})
    return rows
