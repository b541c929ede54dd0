"""An in-memory network of trio byte streams with per-node bandwidth caps and per-link latency.

Used by the tests and by the lead's simulations and benchmarks: it speaks the same stream contract as the libp2p
streams (`send_all`, `receive_some`, `aclose`), so the piece protocol cannot tell them apart. Everything runs on
trio time, so under the autojump clock a 32 MB broadcast at 1 MB/s "takes" 32 s and finishes in a blink.

Model: a sender cuts its data into `chunk` sized pieces; each chunk reserves bytes from the sender's upload bucket
and the receiver's download bucket (one node's links share its caps, fairly, chunk by chunk), waits for the slower
of the two, then arrives `latency` seconds later. A link buffers at most `window` bytes not yet read by the
receiver (a TCP window): a receiver that stops reading stalls its sender, as on a real network.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field

import trio

from p2p.ratelimit import TokenBucket, acquire_all


@dataclass
class _Inbox:
    """Bytes in flight towards one stream end: (arrival time, chunk) in order; None marks the sender's EOF."""

    items: deque = field(default_factory=deque)
    buffered: int = 0
    lot: trio.lowlevel.ParkingLot = field(default_factory=trio.lowlevel.ParkingLot)


class MemoryStream:
    """One end of an in-memory link; implements the trio-style stream contract of p2p.pieces.wire."""

    def __init__(self, net: MemoryNetwork, node: MemNode, remote: MemNode) -> None:
        self._net = net
        self.node = node
        self.remote = remote
        self.peer: MemoryStream | None = None
        self._inbox = _Inbox()
        self._closed = False
        self._sending = False

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        if self._sending:
            raise trio.BusyResourceError("another task is already sending on this stream")
        self._sending = True
        try:
            view = memoryview(data).cast("B")
            for start in range(0, len(view), self._net.chunk):
                await self._send_chunk(bytes(view[start : start + self._net.chunk]))
        finally:
            self._sending = False

    async def _send_chunk(self, chunk: bytes) -> None:
        self._check_open()
        await acquire_all([self.node.upload, self.remote.download], len(chunk))
        self._check_open()
        inbox = self.peer._inbox
        while inbox.buffered > self._net.window:
            await inbox.lot.park()
            self._check_open()
        inbox.items.append((trio.current_time() + self._net.latency, chunk))
        inbox.buffered += len(chunk)
        self.node.bytes_up += len(chunk)
        inbox.lot.unpark_all()

    def _check_open(self) -> None:
        if self._closed:
            raise trio.ClosedResourceError("stream is closed")
        if self.peer._closed:
            raise trio.BrokenResourceError("the remote end closed the link")

    async def receive_some(self, max_bytes: int | None = None) -> bytes:
        max_bytes = max_bytes or 65536
        inbox = self._inbox
        while True:
            if self._closed:
                raise trio.ClosedResourceError("stream is closed")
            if inbox.items:
                arrival, chunk = inbox.items[0]
                if arrival > trio.current_time():
                    await trio.sleep_until(arrival)
                    continue
                if chunk is None:
                    await trio.lowlevel.checkpoint()
                    return b""
                return self._take(max_bytes)
            await inbox.lot.park()

    def _take(self, max_bytes: int) -> bytes:
        inbox, now, parts, size = self._inbox, trio.current_time(), [], 0
        while inbox.items and size < max_bytes:
            arrival, chunk = inbox.items[0]
            if chunk is None or arrival > now:
                break
            if size + len(chunk) > max_bytes:
                cut = max_bytes - size
                inbox.items[0] = (arrival, chunk[cut:])
                chunk = chunk[:cut]
            else:
                inbox.items.popleft()
            parts.append(chunk)
            size += len(chunk)
        inbox.buffered -= size
        self.node.bytes_down += size
        inbox.lot.unpark_all()  # a sender may be waiting for window space
        return b"".join(parts)

    def close_now(self) -> None:
        """Close without a checkpoint (safe in `finally` blocks under cancellation)."""
        if self._closed:
            return
        self._closed = True
        peer_inbox = self.peer._inbox
        peer_inbox.items.append((trio.current_time() + self._net.latency, None))
        peer_inbox.lot.unpark_all()
        self._inbox.lot.unpark_all()

    async def aclose(self) -> None:
        self.close_now()
        await trio.lowlevel.checkpoint()


@dataclass
class MemNode:
    """One simulated host: its caps and its byte counters."""

    name: str
    upload: TokenBucket
    download: TokenBucket
    streams: list[MemoryStream] = field(default_factory=list)
    bytes_up: int = 0
    bytes_down: int = 0

    def disconnect(self) -> None:
        """Close every link of this node at once (the host vanished)."""
        for stream in self.streams:
            stream.close_now()


class MemoryNetwork:
    """Nodes with upload/download caps (bytes per second) joined by links with fixed latency."""

    def __init__(self, latency: float = 0.0, chunk: int = 32 * 1024, window: int = 1 << 20) -> None:
        self.latency = latency
        self.chunk = chunk
        self.window = window
        self.nodes: dict[str, MemNode] = {}

    def add_node(self, name: str, upload_bps: float = math.inf, download_bps: float = math.inf) -> MemNode:
        if name in self.nodes:
            raise ValueError(f"node {name} already exists")
        node = MemNode(name, TokenBucket(upload_bps), TokenBucket(download_bps))
        self.nodes[name] = node
        return node

    def connect(self, a: str, b: str) -> tuple[MemoryStream, MemoryStream]:
        """A new link between two nodes: returns (the end held by a, the end held by b)."""
        na, nb = self.nodes[a], self.nodes[b]
        sa, sb = MemoryStream(self, na, nb), MemoryStream(self, nb, na)
        sa.peer, sb.peer = sb, sa
        na.streams.append(sa)
        nb.streams.append(sb)
        return sa, sb
