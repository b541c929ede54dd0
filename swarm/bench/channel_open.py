"""`swarm bench channel-open`: the CPU one data channel costs to open, with tickets and with a handshake each.

Two real libp2p hosts in this process on loopback, a listener and a dialer; both ends' CPU is this process's, so
each figure is what a channel costs the pair. Each round opens `--channels` channels one after the other (each
closed at once) without tickets (every channel a libp2p stream, a protocol negotiation, an offer, a connect and a
token) and then with the dialer's default tickets (a handshake for every fourth channel, a connect and a token for
the others); rounds alternate, so a machine that slows down meanwhile costs both alike. Prints one JSON object: CPU
milliseconds per channel in each round and the ratio of the medians.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
from typing import TYPE_CHECKING

import trio

from swarm.errors import UserError

if TYPE_CHECKING:
    from p2p.channel.service import DataChannel


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--channels", type=int, default=200, help="channels opened per round (default 200)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of each kind, alternating (default 3)")
    parser.add_argument("--json", action="store_true", help="print one JSON object (the only output form)")


def _cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def run(args: argparse.Namespace) -> int:
    if args.channels < 1 or args.rounds < 1:
        raise UserError("--channels and --rounds must be at least 1")
    result = trio.run(_measure, args.channels, args.rounds)
    print(json.dumps(result))
    return 0


async def _measure(channels: int, rounds: int) -> dict:
    from p2p.channel.service import ChannelConfig, DataChannelServer, open_data_channel
    from p2p.host.p2p_host import open_host

    async def drain(_peer: str, stream: DataChannel) -> None:
        while await stream.receive_some(65536):
            pass

    # the listener's rate and caps lifted: the bench opens channels back to back, as no peer does
    lifted = {"handshakes_per_s": 1e6, "handshake_burst": 10 * channels, "max_channels": 4 * channels}
    kinds = {"handshake": ChannelConfig(**lifted, tickets_per_offer=0), "tickets": ChannelConfig(**lifted)}
    per_channel_ms: dict[str, list[float]] = {kind: [] for kind in kinds}
    async with open_host() as listener_host, open_host() as dialer_host:
        server = DataChannelServer(listener_host, drain, ChannelConfig(**lifted))
        await listener_host.nursery.start(server.run)
        await dialer_host.connect(listener_host.multiaddrs[0])
        for _ in range(rounds):
            for kind, config in kinds.items():
                for _ in range(8):  # warm: imports, first offers, a held ticket
                    await (await open_data_channel(dialer_host, listener_host.peer_id, config)).aclose()
                await trio.sleep(0.2)  # the listener's ends of the warm channels close
                started = _cpu_s()
                for _ in range(channels):
                    await (await open_data_channel(dialer_host, listener_host.peer_id, config)).aclose()
                await trio.sleep(0.2)
                per_channel_ms[kind].append(round((_cpu_s() - started) / channels * 1000, 3))
        ticket_channels = server.ticket_channels
    medians = {kind: statistics.median(values) for kind, values in per_channel_ms.items()}
    return {"channels_per_round": channels, "rounds": rounds, "cpu_ms_per_channel": per_channel_ms,
            "median_ms": medians, "tickets_over_handshake": round(medians["tickets"] / medians["handshake"], 3),
            "ticket_channels": ticket_channels, "mode": "both ends in one process, loopback"}
