"""What `swarm bench sybil` reads from its target processes: CPU and memory from /proc, the node's counters from its
Prometheus endpoint, and what a witness peer receives through the target.

Each target is a real `swarm peer start --json` process (swarm.bench.broadcast.EventProcess) with its metrics endpoint
on; the attackers and the witness run in the bench's own process. CPU figures are the target's own (user + system
seconds per wall second), so what the attackers cost the bench process is not in them, but on a shared machine the
target competes with them and with anything else running for the same cores.
"""

from __future__ import annotations

import ipaddress
import time
import urllib.request
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

import trio

from p2p.host.p2p_host import HostConfig, open_host
from p2p.identity import Identity
from p2p.reach.probe import ReachConfig
from p2p.reach.relay_limits import RelayLimits
from swarm.bench.broadcast import EventProcess
from swarm.bench.local_ports import free_port
from swarm.bench.stalled_preambles import cpu_seconds, rss_mib

if TYPE_CHECKING:
    from multiaddr import Multiaddr

    from p2p.gossip.envelope import Envelope

SAMPLE_EVERY_S = 0.25
START_TIMEOUT_S = 60.0


@dataclass
class Target:
    """A running `swarm peer start` process and what it said when it started listening."""

    proc: EventProcess
    addr: str
    peer_id: str
    metrics_port: int

    @property
    def pid(self) -> int:
        return self.proc.popen.pid

    def alive(self) -> bool:
        return self.proc.popen.poll() is None


def start_peer(work: Path, name: str, run: str, *extra: str) -> Target:
    """`swarm peer start --role seed` of `run` on a loopback port, its metrics endpoint on; `extra` flags on top.
    Returns once it listens (UserError if it exits or takes longer than START_TIMEOUT_S)."""
    port = free_port()
    argv = ["-m", "swarm", "peer", "start", "--json", "--run", run, "--role", "seed",
            "--listen", "/ip4/127.0.0.1/tcp/0", "--data-dir", str(work / name), "--metrics-port", str(port), *extra]
    proc = EventProcess(argv, work / f"{name}.log")
    try:
        listening = proc.wait_for("listening", time.monotonic() + START_TIMEOUT_S)
    except BaseException:
        proc.stop()
        raise
    return Target(proc, listening["addrs"][0], listening["peer_id"], port)


def scrape(port: int) -> dict[str, float]:
    """The target's Prometheus counters, `name` or `name{labels}` -> value; empty once the target is gone."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
            text = response.read().decode()
    except OSError:
        return {}
    values = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            try:
                values[name] = float(value)
            except ValueError:
                continue
    return values


async def scrape_until_cancelled(port: int, latest: dict[str, float], every_s: float = 1.0) -> None:
    """Keep `latest` at the target's newest counters, so a target that dies leaves those it had just before."""
    while True:
        values = await trio.to_thread.run_sync(scrape, port)
        if values:
            latest.clear()
            latest.update(values)
        await trio.sleep(every_s)


def counter(values: dict[str, float], name: str) -> int:
    """A counter's value (exposed as `name`_total), labels summed; 0 when absent."""
    total = name + "_total"
    return int(sum(v for k, v in values.items() if k == total or k.startswith(total + "{")))


@dataclass
class Meter:
    """A process's CPU seconds from a baseline on, and its largest resident memory above the baseline's."""

    pid: int
    baseline_mib: float = 0.0
    peak_mib: float = 0.0
    cpu0: float = 0.0
    t0: float = 0.0
    last: tuple[float, float] = (0.0, 0.0)
    """CPU seconds and the monotonic time of the last sample the process answered."""
    died: bool = False
    died_after_s: float | None = None
    cpu_share: float | None = None
    wall_s: float = 0.0

    def start(self) -> None:
        self.baseline_mib = self.peak_mib = rss_mib(self.pid)
        self.cpu0, self.t0 = cpu_seconds(self.pid), time.monotonic()
        self.last = (self.cpu0, self.t0)

    def sample(self) -> None:
        if self.died:
            return
        try:
            self.peak_mib = max(self.peak_mib, rss_mib(self.pid))
            self.last = (cpu_seconds(self.pid), time.monotonic())
        except (OSError, RuntimeError):  # gone (or a zombie without memory): the process ended
            self.died = True
            self.died_after_s = round(time.monotonic() - self.t0, 1)

    def stop(self) -> None:
        """Close the window: the CPU share over it, or up to the last sample of a process that died."""
        self.sample()
        self.wall_s = time.monotonic() - self.t0
        cpu, at = self.last
        self.cpu_share = (cpu - self.cpu0) / max(at - self.t0, 1e-9)

    def result(self) -> dict:
        return {"target_cpu_share": None if self.cpu_share is None else round(self.cpu_share, 4),
                "target_cpu_s": round(self.last[0] - self.cpu0, 3),
                "target_baseline_rss_mib": round(self.baseline_mib, 1),
                "target_rss_above_baseline_mib": round(self.peak_mib - self.baseline_mib, 1),
                "window_s": round(self.wall_s, 1), "target_died_after_s": self.died_after_s}


async def sample_until_cancelled(meter: Meter) -> None:
    """The meter's memory samples, every SAMPLE_EVERY_S, until the surrounding scope is cancelled."""
    while True:
        meter.sample()
        await trio.sleep(SAMPLE_EVERY_S)


def attacker_config(identity: Identity, reach_mode: str = "public", ip: str = "127.0.0.1") -> HostConfig:
    """A bench host: a fresh identity on a loopback port of `ip`, serving nobody as a relay and asking nobody to dial
    back."""
    return HostConfig(identity=identity, listen=(f"/ip4/{ip}/tcp/0",),
                      reach=ReachConfig(mode=reach_mode, hole_punch=False, relay=RelayLimits(serve=False)))


def dialing_from(ip: str) -> list:
    """The transports of a bench host whose connections leave from `ip`, a loopback address of its own (Linux
    routes all of 127/8 to lo). Why: py-libp2p's TCP dials from the address the kernel picks, 127.0.0.1 toward a
    peer on 127.0.0.1, so every host of the bench would count as one IP to a target's per-IP caps, honest peers
    and the crowd alike, where real ones each come from their own."""
    from libp2p.transport.tcp.tcp import TCP

    class FromIp(TCP):
        async def dial(self, maddr: Multiaddr):
            return await self.dial_with_source(maddr, (ip, 0))

    return [FromIp()]


def loopback_ip(index: int, first: str = "127.0.0.16") -> str:
    """The `index`-th loopback address from `first` on (past .255 into the next /24: all of 127/8 is loopback)."""
    return str(ipaddress.ip_address(first) + index)


Party = TypeVar("Party")
"""Who one attempt of `in_lanes` is for: an Identity, or (Identity, source IP) for the relay crowd."""


async def in_lanes(identities: list[Party], parallel: int, each: Callable[[Party], Awaitable[object]],
                   results: list | None = None) -> list:
    """`each(identity)` for every identity, `parallel` at a time, its result appended to `results` as it comes (so a
    caller that cancels this keeps those that came); an identity whose attempt raised gives None."""
    queue = list(identities)
    results = [] if results is None else results

    async def lane() -> None:
        while queue:
            identity = queue.pop(0)
            try:
                results.append(await each(identity))
            except Exception:  # noqa: BLE001 - the target refused this identity: the next one
                results.append(None)

    async with trio.open_nursery() as nursery:
        for _ in range(max(1, parallel)):
            nursery.start_soon(lane)
    return results


def fresh_identities(n: int) -> list[Identity]:
    return [Identity.generate() for _ in range(n)]


@dataclass
class Witness:
    """An honest peer connected to the target that counts the gossip reaching it from the attackers' identities."""

    attackers: set[str] = field(default_factory=set)
    forwarded: int = 0

    async def run(self, run: str, target_addr: str, kinds: tuple[str, ...],
                  task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED):
        from p2p.gossip.service import open_gossip

        async with open_host(attacker_config(Identity.generate())) as host, \
                open_gossip(host, run, kinds=kinds) as gossip, trio.open_nursery() as nursery:
            await host.connect(target_addr)
            for kind in kinds:
                nursery.start_soon(self._count, gossip.subscribe(kind))
            task_status.started()

    async def _count(self, channel: trio.MemoryReceiveChannel[Envelope]) -> None:
        async for env in channel:
            if env.sender_peer_id in self.attackers:
                self.forwarded += 1
