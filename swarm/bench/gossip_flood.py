"""Benchmark: what a hostile gossip peer costs a target process (CPU share and RSS above its baseline).

`swarm bench gossip-flood --seconds 20 --json` starts a target peer in a process of its own (host and
gossip with the run's typed decoders, as a node has them), joins it with a witness peer and with an attacker that
floods heartbeats and sends inflating envelopes (900 KiB of empty maps, correctly signed, under the rollout kind),
`--identities` fresh identities one after another, each as soon as the last was banned. It prints one JSON object:
the target's CPU share over the attack, its largest RSS above the baseline taken before the attack, what the witness
received from the attackers (anything forwarded), and the target's own counters (refusals by reason, bans).
"""

from __future__ import annotations

import argparse
import cProfile
import json
import subprocess
import sys
import time
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from typing import TYPE_CHECKING

import msgpack
import psutil
import trio

from swarm.bench.local_ports import free_port
from swarm.errors import UserError

if TYPE_CHECKING:
    from p2p.gossip.envelope import Envelope
    from p2p.gossip.service import Gossip
    from p2p.host.p2p_host import P2PHost
    from p2p.identity import Identity

RUN = "bench-flood"
BODY_SLACK = 512


def inflating_envelope(run: str, identity: Identity, ts: float, seq: int, size: int = 900 * 1024) -> bytes:
    """A correctly signed `rollout` envelope of about `size` bytes whose body is a list of empty maps: one byte
    of msgpack each, 64 bytes of Python each once decoded. Built without p2p.gossip.envelope.seal, which would refuse
    to canonicalise it."""
    from p2p.gossip.envelope import VERSION, _signed_bytes

    fields = {"v": VERSION, "kind": "rollout", "run": run, "sender": identity.public_bytes, "ts": float(ts),
              "seq": seq, "body": {"x": [{}] * (size - BODY_SLACK)}}
    return msgpack.packb({**fields, "sig": identity.sign(_signed_bytes(fields))}, use_bin_type=True)


def heartbeat_envelope(run: str, identity: Identity, ts: float, seq: int) -> bytes:
    """A well-formed heartbeat: only its rate is hostile."""
    from p2p.gossip.envelope import seal

    return seal("heartbeat", run, {"roles": ["seed"]}, identity, ts, seq)


def _gossip_config(flooder: bool):
    from p2p.gossip.service import GossipConfig

    return GossipConfig(router_rate_limit=5000.0, publish_rate=4000.0) if flooder else GossipConfig()


async def _serve_target(listen_port: int) -> None:
    """The target: print its address, serve until stdin closes, print its counters."""

    from p2p.gossip.service import open_gossip
    from p2p.host.p2p_host import HostConfig, open_host
    from p2p.identity import Identity
    from swarm.messages.gossip_bodies import DECODERS

    config = HostConfig(identity=Identity.generate(), listen=(f"/ip4/127.0.0.1/tcp/{listen_port}",))
    async with open_host(config) as host, open_gossip(host, RUN, kinds=tuple(DECODERS), decoders=DECODERS) as gossip:
        async with trio.open_nursery() as nursery:
            for kind in DECODERS:
                nursery.start_soon(_discard, gossip.subscribe(kind))
            print(json.dumps({"addr": host.multiaddrs[0]}), flush=True)
            await trio.to_thread.run_sync(sys.stdin.read)  # until the benchmark closes our stdin
            nursery.cancel_scope.cancel()
        print(json.dumps({"rejected": dict(gossip.stats.rejected), "bans": gossip.stats.bans,
                          "delivered": gossip.stats.delivered}), flush=True)


async def _discard(channel: trio.MemoryReceiveChannel[Envelope]) -> None:
    async for _ in channel:
        pass


async def _attack(target_addr: str, target_pid: int, seconds: float, rate: float, identities: int) -> dict:
    from p2p.gossip.service import open_gossip, topic_for
    from p2p.host.p2p_host import HostConfig, open_host
    from p2p.identity import Identity
    from swarm.messages.gossip_bodies import DECODERS

    proc = psutil.Process(target_pid)
    out = {"identities": 0, "heartbeats_sent": 0, "inflating_sent": 0, "forwarded_to_witness": 0}
    attackers: set[str] = set()
    async with open_host(HostConfig(identity=Identity.generate())) as witness_host, \
            open_gossip(witness_host, RUN, kinds=tuple(DECODERS), decoders=DECODERS) as witness:
        await witness_host.connect(target_addr)

        async def watch(kind: str) -> None:
            async for env in witness.subscribe(kind):
                if env.sender_peer_id in attackers:
                    out["forwarded_to_witness"] += 1

        async with trio.open_nursery() as nursery:
            for kind in DECODERS:
                nursery.start_soon(watch, kind)
            await trio.sleep(2.0)  # the target settles (mesh, first heartbeats) before its baseline is taken
            baseline, cpu0, t0 = proc.memory_info().rss, proc.cpu_times(), time.monotonic()
            peak = baseline
            deadline = trio.current_time() + seconds
            while trio.current_time() < deadline and out["identities"] < identities:
                identity = Identity.generate()
                attackers.add(identity.peer_id)
                out["identities"] += 1
                with trio.move_on_at(deadline):
                    await _one_attacker(identity, target_addr, rate, out, open_host, open_gossip, topic_for)
                peak = max(peak, proc.memory_info().rss)
            while trio.current_time() < deadline:  # the rest of the window: what the attack left behind
                peak = max(peak, proc.memory_info().rss)
                await trio.sleep(0.2)
            cpu1, t1 = proc.cpu_times(), time.monotonic()
            peak = max(peak, proc.memory_info().rss)
            nursery.cancel_scope.cancel()
    used = (cpu1.user - cpu0.user) + (cpu1.system - cpu0.system)
    out.update(seconds=round(t1 - t0, 2), target_cpu_share=round(used / (t1 - t0), 4),
               target_baseline_rss_mib=round(baseline / 2**20, 1),
               target_rss_above_baseline_mib=round((peak - baseline) / 2**20, 1))
    return out


async def _one_attacker(identity: Identity, target_addr: str, rate: float, out: dict,
                        open_host: Callable[..., AbstractAsyncContextManager[P2PHost]],
                        open_gossip: Callable[..., AbstractAsyncContextManager[Gossip]],
                        topic_for: Callable[[str, str], str]) -> None:
    """One fresh identity: connect, then inflating envelopes and a heartbeat flood until the target hangs up."""

    from p2p.host.p2p_host import HostConfig

    record = {"sent": 0, "meshed": False, "hung_up_after_s": None}
    out.setdefault("attackers", []).append(record)
    async with open_host(HostConfig(identity=identity)) as host, \
            open_gossip(host, RUN, config=_gossip_config(True)) as gossip:
        await host.connect(target_addr)
        with trio.move_on_after(10):
            for kind in ("heartbeat", "rollout"):
                await gossip.wait_for_mesh(_peer_of(target_addr), kind)
            record["meshed"] = True
        started = trio.current_time()
        publish = {}
        for kind in ("heartbeat", "rollout"):
            gossip.pubsub.remove_topic_validator(topic_for(RUN, kind))
            publish[kind] = (lambda topic: lambda data: gossip.pubsub.publish(topic, data))(topic_for(RUN, kind))
        seq, sent = int(time.time() * 1e6), 0
        while _peer_of(target_addr) in {str(p) for p in host.libp2p.get_connected_peers()}:
            seq += 1
            if sent % max(1, int(rate)) == 0:  # one inflating envelope per second of flood, in an RPC of its own
                await publish["rollout"](inflating_envelope(RUN, identity, time.time(), seq))
                out["inflating_sent"] += 1
                await trio.sleep(0.05)  # py-libp2p resets a stream whose RPC (messages batched) passes 1 MiB
            else:
                await publish["heartbeat"](heartbeat_envelope(RUN, identity, time.time(), seq))
                out["heartbeats_sent"] += 1
                await trio.sleep(1 / rate)
            sent += 1
            record["sent"] = sent
        record["hung_up_after_s"] = round(trio.current_time() - started, 2)


def _peer_of(addr: str) -> str:
    return addr.rsplit("/p2p/", 1)[1]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--seconds", type=float, default=20.0, help="how long the attack lasts")
    parser.add_argument("--rate", type=float, default=1000.0, help="messages per second each attacker sends")
    parser.add_argument("--identities", type=int, default=1,
                        help="fresh attacker identities, one after another as each is banned (default 1)")
    parser.add_argument("--port", type=int, default=0, help="the target's TCP port (0: any free one)")
    parser.add_argument("--profile", default=None, help="write the target's cProfile statistics to this file")
    parser.add_argument("--json", action="store_true", help="print one JSON object (the only output form)")


def run(args: argparse.Namespace) -> int:
    """`swarm bench gossip-flood`: the target in a process of its own, the attack and the witness here."""

    if args.seconds <= 0 or args.rate <= 0 or args.identities < 1:
        raise UserError("--seconds and --rate must be positive and --identities at least 1")
    port = str(args.port or free_port())
    target = subprocess.Popen([sys.executable, "-m", "swarm.bench.gossip_flood", "--serve-target", port,
                               *([args.profile] if args.profile else [])],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        addr = json.loads(target.stdout.readline())["addr"]
        result = trio.run(_attack, addr, target.pid, args.seconds, args.rate, args.identities)
        target.stdin.close()
        result["target"] = json.loads(target.stdout.readline())
    finally:
        if not target.stdin.closed:
            target.stdin.close()
        try:
            target.wait(timeout=30)
        except subprocess.TimeoutExpired:
            target.kill()
    print(json.dumps(result))
    return 0


def _serve_target_main(argv: list[str]) -> None:
    """`python -m swarm.bench.gossip_flood --serve-target PORT [PROFILE]`: the target process."""

    port, profile = int(argv[0]), argv[1] if len(argv) > 1 else None
    if profile is None:
        trio.run(_serve_target, port)
        return

    cProfile.runctx("trio.run(_serve_target, port)", globals(), {"trio": trio, "port": port}, profile)


if __name__ == "__main__" and sys.argv[1:2] == ["--serve-target"]:
    _serve_target_main(sys.argv[2:])
