"""`swarm bench transfer`: one piece-protocol stream over the p2p data channel against raw TCP, same machine, same run.

Why two processes: a sender and a receiver in one trio loop share one core and measure the scheduler, not the
transport. The receiver is this same command with a hidden flag; it prints its addresses as one JSON line and
serves until its stdin closes. Both paths hash everything they receive with BLAKE3 and answer with the digest, and
the clock stops only when the sender has checked that digest, so a number is never reported for corrupt bytes.
Runs alternate between paths so machine noise hits all alike; the medians are reported.

Each run also reports the CPU time each side's thread spent per MiB (`cpu_ms_per_mib`; the receiver sends its own
figure back with the digest). It says where the time goes: a side whose CPU time per MiB is close to the wall
time per MiB limits the stream, and the paths' differences show what the channel and the framing add to each side.

Why the two processes are pinned to different CPUs (when the machine has two; --no-pin turns it off): the stream
runs between two peers, each on its own machine. Left to itself, Linux often wakes the receiver on the sender's CPU
(loopback delivers in the sender's system call), and two CPU-bound processes then share one core, which measures
the scheduler's placement rather than the transport. Both paths run under the same pinning.

Paths: `p2p` (piece frames of p2p/pieces/wire.py over the data channel) against `raw_tcp` (bare bytes on a trio socket)
give the headline ratio; `p2p_unframed` (bare bytes over the data channel) and `raw_tcp_framed` (piece frames over a
trio socket) split the gap between the channel and the framing; `p2p_stream` (--with-stream) is the libp2p fallback.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import struct
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

import blake3
import trio

from p2p.channel.records import preferred_aead
from p2p.pieces.wire import FrameDecoder, Stream, read_frame, write_frame
from swarm.errors import UserError

if TYPE_CHECKING:
    from p2p.host.p2p_host import P2PHost

MIB = 1024 * 1024
PIECE = MIB
RECEIVE_CHUNK = MIB  # p2p/pieces/wire.py RECEIVE_CHUNK: one whole data-channel record per read on every path
_U64 = struct.Struct(">Q")
_DIGEST_AND_CPU = struct.Struct(">32sd")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--size-mb", type=int, default=256, help="MiB sent per run (default 256)")
    parser.add_argument("--repeats", dest="repeat", type=int, default=5, metavar="N",
                        help="runs per path; medians are reported")
    parser.add_argument("--repeat", dest="repeat", type=int, default=5, help=argparse.SUPPRESS)
    parser.add_argument("--json", action="store_true", help="print one JSON object (the default output too)")
    parser.add_argument(
        "--with-stream", action="store_true", help="also measure the libp2p-stream fallback (mib_s_p2p_stream)"
    )
    parser.add_argument(
        "--aead",
        choices=["auto", "chacha20-poly1305", "aes-256-gcm", "aes-256-ocb3"],
        default="auto",
        help="data channel cipher (auto: the faster AES mode measured here given AES instructions, else ChaCha20)",
    )
    parser.add_argument(
        "--no-pin", action="store_true", help="let the OS place sender and receiver (default: one CPU each)"
    )
    parser.add_argument("--receiver", action="store_true", help=argparse.SUPPRESS)


@dataclass(frozen=True)
class BenchPlan:
    """What one benchmark invocation measures."""

    size_mb: int
    repeat: int
    with_stream: bool
    aead: str
    pin: bool = True

    def __post_init__(self) -> None:
        if not 1 <= self.size_mb <= 16384:
            raise UserError(f"--size-mb must be between 1 and 16384, got {self.size_mb}")
        if not 1 <= self.repeat <= 100:
            raise UserError(f"--repeats must be between 1 and 100, got {self.repeat}")


def run(args: argparse.Namespace) -> int:
    aead = preferred_aead() if args.aead == "auto" else args.aead
    if args.receiver:
        trio.run(_receiver_main, aead)
        return 0
    plan = BenchPlan(args.size_mb, args.repeat, args.with_stream, aead, pin=not args.no_pin)
    result = trio.run(_sender_main, plan)
    print(json.dumps(result, sort_keys=True))
    return 0 if result["verified"] else 1


# ----------------------------------------------------------------------------------------------- receiver
# Every bench connection starts with one mode byte: b"F" piece frames (p2p/pieces/wire.py), b"U" unframed bytes.
# The same code runs over the data channel, the libp2p-stream fallback and a raw trio socket (one interface).


async def _read_exact(stream: Stream, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = await stream.receive_some(size - len(data))
        if not chunk:
            raise EOFError("bench stream ended early")
        data += chunk
    return data


async def _receive_framed(stream: Stream) -> None:
    """Read the bench frames through the piece-protocol framing, hash the payloads, answer with the digest and the
    CPU seconds this took."""

    cpu_start = time.thread_time()
    decoder = FrameDecoder()
    hasher = blake3.blake3()
    frame = await read_frame(stream, decoder)
    if frame is None or frame[0].get("t") != "bench":
        raise ValueError("bench stream must start with a bench frame")
    for index in range(int(frame[0]["pieces"])):
        frame = await read_frame(stream, decoder)
        if frame is None or frame[0].get("t") != "piece" or frame[0].get("index") != index:
            raise ValueError(f"bench stream lost piece {index}")
        hasher.update(frame[1])
    await write_frame(stream, {"t": "bench-done", "blake3": hasher.digest(), "cpu_s": time.thread_time() - cpu_start})


async def _receive_unframed(stream: Stream) -> None:
    """A u64 length, the bytes (bounded reads into one hasher), the digest and the CPU seconds back."""
    cpu_start = time.thread_time()
    (remaining,) = _U64.unpack(await _read_exact(stream, _U64.size))
    hasher = blake3.blake3()
    if isinstance(stream, trio.SocketStream):
        await _receive_raw_socket(stream.socket, remaining, hasher)
    else:
        await _receive_stream(stream, remaining, hasher)
    await stream.send_all(_DIGEST_AND_CPU.pack(hasher.digest(), time.thread_time() - cpu_start))


async def _receive_stream(stream: Stream, remaining: int, hasher: blake3.blake3) -> None:
    while remaining:
        data = await stream.receive_some(min(RECEIVE_CHUNK, remaining))
        if not data:
            raise EOFError("bench stream ended early")
        hasher.update(data)
        remaining -= len(data)


async def _receive_raw_socket(sock: trio.socket.SocketType, remaining: int, hasher: blake3.blake3) -> None:
    """The raw TCP baseline at its best: recv_into one reused buffer (no allocation per read), hash the view."""
    buffer = memoryview(bytearray(RECEIVE_CHUNK))
    while remaining:
        got = await sock.recv_into(buffer[: min(RECEIVE_CHUNK, remaining)])
        if not got:
            raise EOFError("bench stream ended early")
        hasher.update(buffer[:got])
        remaining -= got


async def _receive(stream: Stream, peer_id: str = "") -> None:
    mode = await _read_exact(stream, 1)
    await (_receive_framed if mode == b"F" else _receive_unframed)(stream)
    await stream.aclose()


async def _receiver_main(aead: str) -> None:
    from p2p.channel.service import ChannelConfig, serve_data_channels
    from p2p.host.p2p_host import open_host

    async with open_host() as host, trio.open_nursery() as nursery:
        config = ChannelConfig(aead=aead)
        await nursery.start(serve_data_channels, host, lambda peer, stream: _receive(stream, peer), config)
        raw = await nursery.start(trio.serve_tcp, _receive, 0)
        raw_port = raw[0].socket.getsockname()[1]
        print(json.dumps({"multiaddr": host.multiaddrs[0], "raw_port": raw_port}), flush=True)
        await trio.wrap_file(sys.stdin).read()  # the sender closes our stdin when it is done
        nursery.cancel_scope.cancel()


# ------------------------------------------------------------------------------------------------- sender


async def _send_framed(stream: Stream, data: bytes) -> tuple[bytes, float]:
    view = memoryview(data)
    pieces = (len(data) + PIECE - 1) // PIECE
    await stream.send_all(b"F")
    await write_frame(stream, {"t": "bench", "pieces": pieces})
    for index in range(pieces):
        await write_frame(stream, {"t": "piece", "index": index}, view[index * PIECE : (index + 1) * PIECE])
    frame = await read_frame(stream, FrameDecoder())
    if frame is None or frame[0].get("t") != "bench-done":
        raise RuntimeError("receiver closed the bench stream without a digest")
    return bytes(frame[0]["blake3"]), float(frame[0]["cpu_s"])


async def _send_unframed(stream: Stream, data: bytes) -> tuple[bytes, float]:
    await stream.send_all(b"U" + _U64.pack(len(data)))
    view = memoryview(data)
    for offset in range(0, len(data), PIECE):
        await stream.send_all(view[offset : offset + PIECE])
    return _DIGEST_AND_CPU.unpack(await _read_exact(stream, _DIGEST_AND_CPU.size))


# (path name, transport, framed): "p2p" and "raw_tcp" are the headline pair; the others locate the costs.
PATHS = {
    "p2p": ("channel", True),
    "raw_tcp": ("tcp", False),
    "p2p_unframed": ("channel", False),
    "raw_tcp_framed": ("tcp", True),
    "p2p_stream": ("stream", True),
}


async def _open_path(transport: str, host: P2PHost, peer_id: str, raw_port: int):
    from p2p.channel.service import ChannelConfig, open_data_channel

    if transport == "tcp":
        return await trio.open_tcp_stream("127.0.0.1", raw_port)
    config = ChannelConfig(use_socket=transport == "channel", allow_fallback=False)
    return await open_data_channel(host, peer_id, config)


@dataclass(frozen=True)
class PathRun:
    """One run of one path: wall seconds from the first byte sent until the receiver's digest is back, the CPU
    seconds of the sending and the receiving thread over that run, and whether the digest matched."""

    seconds: float
    sender_cpu_s: float
    receiver_cpu_s: float
    verified: bool


async def _time_path(path: str, host: P2PHost, peer_id: str, raw_port: int, data: bytes) -> PathRun:
    transport, framed = PATHS[path]
    stream = await _open_path(transport, host, peer_id, raw_port)
    try:
        start, cpu_start = trio.current_time(), time.thread_time()
        digest, receiver_cpu = await (_send_framed if framed else _send_unframed)(stream, data)
        elapsed, sender_cpu = trio.current_time() - start, time.thread_time() - cpu_start
    finally:
        await stream.aclose()
    return PathRun(elapsed, sender_cpu, receiver_cpu, digest == blake3.blake3(data).digest())


async def _start_receiver(aead: str):
    cmd = [sys.executable, "-m", "swarm", "bench", "transfer", "--receiver", "--aead", aead]
    proc = await trio.lowlevel.open_process(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    line = b""
    with trio.fail_after(60):
        while not line.endswith(b"\n"):
            chunk = await proc.stdout.receive_some(4096)
            if not chunk:
                raise RuntimeError("bench receiver exited before printing its address")
            line += chunk
    return proc, json.loads(line)


def pin_cpus(receiver_pid: int) -> list[int] | None:
    """Put this process and the receiver on two different CPUs of those we may use; None if fewer than two."""
    if not hasattr(os, "sched_setaffinity"):
        return None
    allowed = sorted(os.sched_getaffinity(0))
    if len(allowed) < 2:
        return None
    sender_cpu, receiver_cpu = allowed[0], allowed[1]
    try:
        os.sched_setaffinity(receiver_pid, {receiver_cpu})
        os.sched_setaffinity(0, {sender_cpu})
    except OSError:  # a sandbox that forbids it: measure as placed, and say so in the result
        return None
    return [sender_cpu, receiver_cpu]


async def _sender_main(plan: BenchPlan) -> dict:
    from p2p.host.p2p_host import open_host

    data = os.urandom(plan.size_mb * MIB)
    paths = list(PATHS) if plan.with_stream else list(PATHS)[:4]
    proc, info = await _start_receiver(plan.aead)
    pinned = pin_cpus(proc.pid) if plan.pin else None
    runs: dict[str, list[PathRun]] = {path: [] for path in paths}
    try:
        async with open_host() as host:
            peer_id = await host.connect(info["multiaddr"])
            for _ in range(plan.repeat):
                for path in paths:  # interleaved, so machine noise hits every path alike
                    runs[path].append(await _time_path(path, host, peer_id, info["raw_port"], data))
    finally:
        await proc.stdin.aclose()
        with trio.move_on_after(10):
            await proc.wait()
        if proc.returncode is None:
            proc.kill()
    return _summary(plan, runs, pinned)


def _summary(plan: BenchPlan, runs: dict[str, list[PathRun]], pinned: list[int] | None) -> dict:
    verified = all(run.verified for samples in runs.values() for run in samples)
    result: dict = {"size_mb": plan.size_mb, "repeat": plan.repeat, "aead": plan.aead, "verified": verified,
                    "pinned_cpus": pinned, "cpu_ms_per_mib": {}}
    for path, samples in runs.items():
        result[f"mib_s_{path}"] = round(plan.size_mb / statistics.median(run.seconds for run in samples), 1)
        result["cpu_ms_per_mib"][path] = {
            side: round(statistics.median(getattr(run, f"{side}_cpu_s") for run in samples) * 1e3 / plan.size_mb, 3)
            for side in ("sender", "receiver")
        }
    result["ratio"] = round(result["mib_s_p2p"] / result["mib_s_raw_tcp"], 3)
    return result
