"""`swarm bench stalled-preambles`: what stalled data-channel preambles of many fresh identities cost a real
`swarm peer` process.

The attack: `--identities` fresh libp2p identities, each opening `--channels` data channels to the target and
sending a preamble that declares `--declared-kib` of manifest (by default the most a preamble may carry), then all
of it but the last KiB, then stalling (swarm.policy.link_preamble refuses a larger declaration at the head, and the
mirror caps the channels waiting for their preamble). Prints one JSON object:
the target's resident memory (VmRSS) before the attack and at its peak during it, the CPU seconds it spent over
the hold, what the attackers got to send, and whether the target was still running.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING

import trio

from swarm.errors import UserError

if TYPE_CHECKING:
    from p2p.host.p2p_host import P2PHost

MIB = 1 << 20


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--identities", type=int, default=6, help="fresh attacker identities (default 6)")
    parser.add_argument("--channels", type=int, default=4, help="data channels each identity opens (default 4)")
    parser.add_argument("--declared-kib", type=int, default=64,
                        help="manifest size each preamble declares, in KiB (default 64, the most a preamble carries)")
    parser.add_argument("--hold", type=float, default=20.0, help="seconds the attack lasts (default 20)")
    parser.add_argument("--settle", type=float, default=5.0, help="seconds the target runs before its baseline")
    parser.add_argument("--json", action="store_true", help="print one JSON object (the only output form)")


def run(args: argparse.Namespace) -> int:
    """The target in a process of its own (`swarm peer start --role seed`), the attackers here."""

    from swarm.bench.broadcast import EventProcess

    if args.identities < 1 or args.channels < 1 or args.declared_kib < 1 or args.hold <= 0 or args.settle < 0:
        raise UserError("--identities, --channels and --declared-kib must be at least 1, --hold positive and "
                        "--settle not negative")
    with tempfile.TemporaryDirectory() as tmp:
        target = EventProcess(["-m", "swarm", "peer", "start", "--json", "--run", "attack", "--role", "seed",
                               "--listen", "/ip4/127.0.0.1/tcp/0", "--data-dir", str(Path(tmp) / "target")],
                              Path(tmp) / "target.log")
        try:
            listening = target.wait_for("listening", time.monotonic() + 60)
            time.sleep(args.settle)
            pid = target.popen.pid
            baseline = rss_mib(pid)
            result = trio.run(attack, listening["addrs"][0], listening["peer_id"], pid, args)
            alive = target.popen.poll() is None
        finally:
            target.stop()
    print(json.dumps({"identities": args.identities, "channels_each": args.channels,
                      "declared_kib": args.declared_kib, "baseline_rss_mib": round(baseline, 1), **result,
                      "peak_above_baseline_mib": round(result["peak_rss_mib"] - baseline, 1),
                      "target_alive": alive}))
    return 0


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS line")


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def stall(host: P2PHost, target: str, declared: int, channels: int, sent: list[int]) -> None:
    """Open `channels` data channels one after another, each sending all of a declared manifest but its last KiB;
    a channel the target drops (its read rate spent, or no room to wait) gives way to the next."""
    from p2p.channel.service import open_data_channel

    for _ in range(channels):
        try:
            stream = await open_data_channel(host, target)
            await stream.send_all(bytes(32) + declared.to_bytes(4, "big"))
            left = declared - 1024
            while left > 0:
                chunk = min(left, MIB)
                await stream.send_all(bytes(chunk))
                sent[0] += chunk
                left -= chunk
        except Exception:  # noqa: BLE001 - the target dropped this channel: the next one
            continue


async def attack(addr: str, target_id: str, pid: int, args: argparse.Namespace) -> dict:
    peak, samples = rss_mib(pid), []
    sent = [0]
    async with trio.open_nursery() as nursery:
        hosts = []
        for _ in range(args.identities):
            host = await nursery.start(_host)
            await host.connect(addr)
            hosts.append(host)
        cpu0, t0 = cpu_seconds(pid), time.monotonic()
        for host in hosts:
            nursery.start_soon(stall, host, target_id, args.declared_kib * 1024, args.channels, sent)
        end = trio.current_time() + args.hold
        while trio.current_time() < end:
            await trio.sleep(0.25)
            if not Path(f"/proc/{pid}").exists():
                break
            samples.append(rss_mib(pid))
            peak = max(peak, samples[-1])
        cpu = cpu_seconds(pid) - cpu0 if Path(f"/proc/{pid}").exists() else None  # None: the target died
        wall = time.monotonic() - t0
        nursery.cancel_scope.cancel()
    return {"peak_rss_mib": round(peak, 1), "cpu_s": None if cpu is None else round(cpu, 2), "wall_s": round(wall, 1),
            "cpu_share_of_a_core": None if cpu is None else round(cpu / wall, 3),
            "attack_bytes_sent_kib": round(sent[0] / 1024, 1),
            "last_rss_mib": round(samples[-1], 1) if samples else None}


async def _host(task_status: trio.TaskStatus[P2PHost] = trio.TASK_STATUS_IGNORED) -> None:
    from p2p.host.p2p_host import open_host

    async with open_host() as host:
        task_status.started(host)
        await trio.sleep_forever()
