"""Measure what stalled data-channel preambles of many fresh identities cost a real `swarm peer` process.

The attack: IDENTITIES fresh libp2p identities, each opening CHANNELS data channels to the target and sending a
preamble that declares DECLARED_MIB of manifest, then all of it but the last 64 KiB, then stalling. Prints one JSON
line: the target's resident memory (VmRSS) before the attack and at its peak during it, the CPU seconds it spent
over the hold, and whether it was still running. The target is the `swarm` package found from the current
directory, so running it from another checkout's root measures that checkout:

    PYTHONPATH=$PWD python tests/measure_stalled_preambles.py [--identities 6] [--channels 4] [--hold 20]

Not a test (pytest collects test_*.py only): it takes about half a minute of two cores, so it is run by hand.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import trio

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from p2p.channel import open_data_channel  # noqa: E402
from p2p.host import open_host  # noqa: E402
from swarm.bench_broadcast import EventProcess  # noqa: E402

MIB = 1 << 20


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS line")


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def stall(host, target: str, declared: int, channels: int, sent: list[int]) -> None:
    for _ in range(channels):
        try:
            stream = await open_data_channel(host, target)
            await stream.send_all(bytes(32) + declared.to_bytes(4, "big"))
            left = declared - 64 * 1024
            while left > 0:
                chunk = min(left, MIB)
                await stream.send_all(bytes(chunk))
                sent[0] += chunk
                left -= chunk
        except Exception:  # noqa: BLE001 - the target dropped this channel (its budget was spent): the next one
            continue


async def attack(addr: str, target_id: str, pid: int, args) -> dict:
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
            nursery.start_soon(stall, host, target_id, args.declared_mib * MIB, args.channels, sent)
        end = trio.current_time() + args.hold
        while trio.current_time() < end:
            await trio.sleep(0.25)
            if not Path(f"/proc/{pid}").exists():
                break
            samples.append(rss_mib(pid))
            peak = max(peak, samples[-1])
        cpu = cpu_seconds(pid) - cpu0 if Path(f"/proc/{pid}").exists() else float("nan")
        wall = time.monotonic() - t0
        nursery.cancel_scope.cancel()
    return {"peak_rss_mib": round(peak, 1), "cpu_s": round(cpu, 2), "wall_s": round(wall, 1),
            "cpu_share_of_a_core": round(cpu / wall, 3), "attack_bytes_sent_mib": round(sent[0] / MIB, 1),
            "last_rss_mib": round(samples[-1], 1) if samples else None}


async def _host(task_status=trio.TASK_STATUS_IGNORED):
    async with open_host() as host:
        task_status.started(host)
        await trio.sleep_forever()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--identities", type=int, default=6)
    parser.add_argument("--channels", type=int, default=4)
    parser.add_argument("--declared-mib", type=int, default=32)
    parser.add_argument("--hold", type=float, default=20.0)
    parser.add_argument("--settle", type=float, default=5.0, help="seconds the target runs before its baseline")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        target = EventProcess(["-m", "swarm", "peer", "start", "--json-events", "--run", "attack", "--role", "seed",
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
            target.popen.terminate()
            target.popen.wait(30)
    print(json.dumps({"identities": args.identities, "channels_each": args.channels,
                      "declared_mib": args.declared_mib, "baseline_rss_mib": round(baseline, 1), **result,
                      "peak_above_baseline_mib": round(result["peak_rss_mib"] - baseline, 1),
                      "target_alive": alive}))


if __name__ == "__main__":
    main()
