"""`swarm bench transfer`: one piece-protocol stream over the p2p data channel against raw TCP, same machine, same run.

Why two processes: a sender and a receiver in one trio loop share one core and measure the scheduler, not the
transport. The receiver is this same command with a hidden flag; it prints its addresses as one JSON line and
serves until its stdin closes. Both paths hash everything they receive with BLAKE3 and answer with the digest, and
the clock stops only when the sender has checked that digest, so a number is never reported for corrupt bytes.
Runs alternate p2p / raw so machine noise hits both alike; the medians are reported.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import struct
import subprocess
import sys
from dataclasses import dataclass

import blake3
import trio

MIB = 1024 * 1024
PIECE = MIB
_U64 = struct.Struct(">Q")
RECEIVE_CHUNK = MIB


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--size-mb", type=int, default=256, help="MiB sent per run (default 256)")
    parser.add_argument("--repeat", type=int, default=3, help="runs per path; medians are reported (default 3)")
    parser.add_argument("--json", action="store_true", help="print one JSON object (the default output too)")
    parser.add_argument(
        "--with-stream", action="store_true", help="also measure the libp2p-stream fallback (mib_s_p2p_stream)"
    )
    parser.add_argument("--receiver", action="store_true", help=argparse.SUPPRESS)


@dataclass(frozen=True)
class BenchPlan:
    """What one benchmark invocation measures."""

    size_mb: int
    repeat: int
    with_stream: bool

    def __post_init__(self) -> None:
        from swarm.errors import UserError

        if not 1 <= self.size_mb <= 16384:
            raise UserError(f"--size-mb must be between 1 and 16384, got {self.size_mb}")
        if not 1 <= self.repeat <= 100:
            raise UserError(f"--repeat must be between 1 and 100, got {self.repeat}")


def run(args: argparse.Namespace) -> int:
    if args.receiver:
        trio.run(_receiver_main)
        return 0
    plan = BenchPlan(args.size_mb, args.repeat, args.with_stream)
    result = trio.run(_sender_main, plan)
    print(json.dumps(result, sort_keys=True))
    return 0 if result["verified"] else 1


# ----------------------------------------------------------------------------------------------- receiver


async def _receive_pieces(peer_id: str, stream) -> None:
    """Read the bench frames through the piece-protocol framing, hash the payloads, answer with the digest."""
    from p2p.wire import FrameDecoder, read_frame, write_frame

    decoder = FrameDecoder()
    hasher = blake3.blake3()
    frame = await read_frame(stream, decoder, RECEIVE_CHUNK)
    if frame is None or frame[0].get("t") != "bench":
        raise ValueError("bench stream must start with a bench frame")
    for index in range(int(frame[0]["pieces"])):
        frame = await read_frame(stream, decoder, RECEIVE_CHUNK)
        if frame is None or frame[0].get("t") != "piece" or frame[0].get("index") != index:
            raise ValueError(f"bench stream lost piece {index}")
        hasher.update(frame[1])
    await write_frame(stream, {"t": "bench-done", "blake3": hasher.digest()})


async def _receive_raw(sock: trio.SocketStream) -> None:
    """Raw TCP baseline: a u64 length, the bytes (bounded reads into one hasher), the digest back."""
    header = b""
    while len(header) < _U64.size:
        data = await sock.receive_some(_U64.size - len(header))
        if not data:
            return
        header += data
    (remaining,) = _U64.unpack(header)
    hasher = blake3.blake3()
    while remaining:
        data = await sock.receive_some(min(RECEIVE_CHUNK, remaining))
        if not data:
            return
        hasher.update(data)
        remaining -= len(data)
    await sock.send_all(hasher.digest())
    await sock.aclose()


async def _receiver_main() -> None:
    from p2p.channel import serve_data_channels
    from p2p.host import open_host

    async with open_host() as host, trio.open_nursery() as nursery:
        await nursery.start(serve_data_channels, host, _receive_pieces)
        raw = await nursery.start(trio.serve_tcp, _receive_raw, 0)
        raw_port = raw[0].socket.getsockname()[1]
        print(json.dumps({"multiaddr": host.multiaddrs[0], "raw_port": raw_port}), flush=True)
        await trio.wrap_file(sys.stdin).read()  # the sender closes our stdin when it is done
        nursery.cancel_scope.cancel()


# ------------------------------------------------------------------------------------------------- sender


async def _send_pieces(stream, data: bytes) -> bytes:
    from p2p.wire import FrameDecoder, read_frame, write_frame

    view = memoryview(data)
    pieces = (len(data) + PIECE - 1) // PIECE
    await write_frame(stream, {"t": "bench", "pieces": pieces})
    for index in range(pieces):
        await write_frame(stream, {"t": "piece", "index": index}, view[index * PIECE : (index + 1) * PIECE])
    frame = await read_frame(stream, FrameDecoder())
    if frame is None or frame[0].get("t") != "bench-done":
        raise RuntimeError("receiver closed the bench stream without a digest")
    return bytes(frame[0]["blake3"])


async def _time_p2p(host, peer_id: str, data: bytes, use_socket: bool) -> tuple[float, bool]:
    from p2p.channel import ChannelConfig, open_data_channel

    stream = await open_data_channel(host, peer_id, ChannelConfig(use_socket=use_socket, allow_fallback=False))
    try:
        start = trio.current_time()
        digest = await _send_pieces(stream, data)
        elapsed = trio.current_time() - start
    finally:
        await stream.aclose()
    return elapsed, digest == blake3.blake3(data).digest()


async def _time_raw(port: int, data: bytes) -> tuple[float, bool]:
    sock = await trio.open_tcp_stream("127.0.0.1", port)
    async with sock:
        start = trio.current_time()
        await sock.send_all(_U64.pack(len(data)))
        view = memoryview(data)
        for offset in range(0, len(data), MIB):
            await sock.send_all(view[offset : offset + MIB])
        digest = b""
        while len(digest) < 32:
            chunk = await sock.receive_some(32 - len(digest))
            if not chunk:
                break
            digest += chunk
        elapsed = trio.current_time() - start
    return elapsed, digest == blake3.blake3(data).digest()


async def _start_receiver():
    cmd = [sys.executable, "-m", "swarm", "bench", "transfer", "--receiver"]
    proc = await trio.lowlevel.open_process(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    line = b""
    with trio.fail_after(60):
        while not line.endswith(b"\n"):
            chunk = await proc.stdout.receive_some(4096)
            if not chunk:
                raise RuntimeError("bench receiver exited before printing its address")
            line += chunk
    return proc, json.loads(line)


async def _sender_main(plan: BenchPlan) -> dict:
    from p2p.host import open_host

    data = os.urandom(plan.size_mb * MIB)
    proc, info = await _start_receiver()
    times: dict[str, list[float]] = {"p2p": [], "raw": [], "stream": []}
    verified = True
    try:
        async with open_host() as host:
            peer_id = await host.connect(info["multiaddr"])
            for _ in range(plan.repeat):
                for name in ("p2p", "raw", "stream") if plan.with_stream else ("p2p", "raw"):
                    if name == "raw":
                        elapsed, ok = await _time_raw(info["raw_port"], data)
                    else:
                        elapsed, ok = await _time_p2p(host, peer_id, data, use_socket=name == "p2p")
                    times[name].append(elapsed)
                    verified &= ok
    finally:
        await proc.stdin.aclose()
        with trio.move_on_after(10):
            await proc.wait()
        if proc.returncode is None:
            proc.kill()
    return _summary(plan, times, verified)


def _summary(plan: BenchPlan, times: dict[str, list[float]], verified: bool) -> dict:
    def rate(name: str) -> float:
        return round(plan.size_mb / statistics.median(times[name]), 1)

    result = {
        "size_mb": plan.size_mb,
        "repeat": plan.repeat,
        "mib_s_p2p": rate("p2p"),
        "mib_s_raw_tcp": rate("raw"),
        "verified": verified,
    }
    result["ratio"] = round(result["mib_s_p2p"] / result["mib_s_raw_tcp"], 3)
    if times["stream"]:
        result["mib_s_p2p_stream"] = rate("stream")
    return result
