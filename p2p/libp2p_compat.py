"""Adapters from py-libp2p streams to the trio-style byte-stream contract, plus the measured Yamux tuning
(docs/reference.md#py-libp2p-pitfalls), and process-wide fixes to py-libp2p's per-message costs (p2p.gossip.pubsub
holds the pubsub ones).

The contract (p2p/pieces/wire.py's `Stream`): `send_all(data)`, `receive_some(max_bytes) -> bytes` (b"" at EOF),
`aclose()`. A libp2p stream is the fallback transport of the data channel when a peer's data socket cannot be
reached (relays, NAT): slower (about 0.25x of raw TCP) but always available.
"""

from __future__ import annotations

import logging
import os
import weakref

import trio
from libp2p.abc import IHost, INetStream
from libp2p.io.trio import TrioTCPStream
from libp2p.network.stream.exceptions import StreamEOF
from libp2p.pubsub import gossipsub as gossipsub_module
from libp2p.pubsub import pubsub as pubsub_module
from libp2p.stream_muxer.yamux import yamux
from libp2p.tools.anyio_service.trio_manager import TrioManager
from libp2p.tools.anyio_service.trio_tasks import FunctionTask

from p2p.errors import ChannelError

log = logging.getLogger(__name__)

READ_CHUNK = 1024 * 1024
"""Upper bound of one read: an unbounded Yamux `read()` concatenates buffers and collapses to a few MiB/s."""
WRITE_CHUNK = 8 * 1024 * 1024
"""8 MiB writes amortise Yamux's per-write locking (docs/reference.md#py-libp2p-pitfalls)."""
NOISE_SIZED_YAMUX_FRAME = 65_519
"""A Yamux frame (12-byte header included) that fits one Noise message (65,535 bytes minus the 16-byte tag)."""
YAMUX_RTT_EVERY_S = 300.0
"""Seconds between two Yamux round-trip measurements on a connection (py-libp2p: 30)."""
YAMUX_SWEEP_EVERY_S = 120.0
"""Seconds between two sweeps of a connection's closed-stream bookkeeping (py-libp2p: 30)."""


def tune_yamux() -> None:
    """Apply the measured Yamux tuning once per process.

    - PY_YAMUX_RELEASE_ON_READ=0 (read by py-libp2p at call time): window credit is released in batches, 37x
      fewer window-update frames. Set only if the user has not chosen a value.
    - MAX_MESSAGE_SIZE is a module constant py-libp2p reads on every write; it has no setter, so we assign it:
      frames of 65,519 bytes travel as one Noise message instead of two. It changes only the sender's framing,
      which every Yamux peer accepts.
    - RTT_MEASURE_INTERVAL and _STALE_STREAM_SWEEP_INTERVAL, module constants read at each wait: a ping every
      YAMUX_RTT_EVERY_S and a sweep every YAMUX_SWEEP_EVERY_S. Why: every connection pinged its peer every 30 s
      (a frame out and one in, each a Noise message and a socket call, on both ends), so a peer holding 44
      connections handled about six ping frames a second, as many as all its gossip RPCs between versions
      (swarm.bench.scale, 64 peers). The RTT only sizes the receive window's growth, and the first ping still
      goes out half a second after the connection opens; the sweep only reclaims streams that closed uncleanly.
    """
    os.environ.setdefault("PY_YAMUX_RELEASE_ON_READ", "0")
    if yamux.MAX_MESSAGE_SIZE > NOISE_SIZED_YAMUX_FRAME:
        yamux.MAX_MESSAGE_SIZE = NOISE_SIZED_YAMUX_FRAME
    yamux.RTT_MEASURE_INTERVAL = max(yamux.RTT_MEASURE_INTERVAL, YAMUX_RTT_EVERY_S)
    yamux._STALE_STREAM_SWEEP_INTERVAL = max(yamux._STALE_STREAM_SWEEP_INTERVAL, YAMUX_SWEEP_EVERY_S)
    if not getattr(yamux.YamuxStream._auto_tune_and_send_window_update, "at_half", False):
        yamux.YamuxStream._auto_tune_and_send_window_update = grant_window_at_half  # type: ignore[method-assign]
    if not getattr(yamux.Yamux._write_frame, "lean", False):
        yamux.Yamux._write_frame = write_frame  # type: ignore[method-assign]


async def grant_window_at_half(stream: INetStream, *, bytes_read: int = 0) -> None:
    """Send a Yamux WINDOW_UPDATE once the credit owed reaches half the receive window (go-yamux's rule), or at
    any read while the sender has less than one frame of credit left.

    Why: py-libp2p 0.8.1 also grants "partial slack", the bytes of every read of a stream whose owed credit is
    below that half, so each small gossip message read costs the reader a window-update frame (one Noise message and
    one socket write): a third of the frames a peer sends while heartbeats flow. The credit owed is what was read
    and not yet granted back. The second condition is for slow readers: py-libp2p's writer gives up and resets the
    stream after 5 s without credit, so a sender that has used its window is granted what each read frees.
    Most reads owe nothing yet: those are answered without taking the window lock (a scheduler pass per read).
    """
    if not stream.window_lock.locked() and not _grant_due(stream):
        return  # what the check under the lock would find: no task holds it to change the window meanwhile
    async with stream.window_lock:
        if not _grant_due(stream):
            return
        buffered = len(stream.conn.stream_buffers.get(stream.stream_id, b""))
        grant = stream._grow_to_delta(buffered) + stream._apply_autotune_epoch(buffered)
    if grant > 0:
        await stream.send_window_update(grant, skip_lock=True)


grant_window_at_half.at_half = True  # type: ignore[attr-defined]


def _grant_due(stream: INetStream) -> bool:
    """Whether half the receive window is owed, or the sender has less than one frame of credit (and any owed)."""
    buffered = len(stream.conn.stream_buffers.get(stream.stream_id, b""))
    owed = stream.target_recv_window - (stream.recv_window + buffered)
    starved = stream.recv_window < yamux.MAX_MESSAGE_SIZE
    return owed > 0 and (starved or owed >= stream._grow_threshold())


async def write_frame(conn: yamux.Yamux, data: bytes) -> None:
    """py-libp2p's `Yamux._write_frame` without its debug line, which it formats for every frame whether debug
    logging is on or not (an unpack of the header and an f-string, about a tenth of a small frame's cost), and
    without its checkpoint after the write: the socket send already yields to the scheduler once it has sent."""
    async with conn._write_lock:
        await conn.secured_conn.write(data)


write_frame.lean = True  # type: ignore[attr-defined]


TCP_READ_AHEAD = 64 * 1024
"""Bytes one socket read of a libp2p TCP connection asks for (`read_tcp_ahead`)."""


def read_tcp_ahead() -> None:
    """Make each read of a libp2p TCP connection take up to TCP_READ_AHEAD bytes and serve later reads from them.

    Why: Noise reads each message as its 2-byte length and then its body, two socket reads, and py-libp2p's TCP
    stream passes each to the socket as asked: a lock, a `recv` and two scheduler passes per read, three `recv`s
    per small gossip frame (the first finds nothing yet). Socket reads are then about a fifth of a peer's CPU while
    heartbeats flow. Read ahead, a frame costs one `recv` and the frames that arrived together share it. The
    bytes are served in order whoever reads; applied once per process.
    """
    if getattr(TrioTCPStream.read, "ahead", False):
        return
    read_socket = TrioTCPStream.read

    async def read(self: TrioTCPStream, n: int | None = None) -> bytes:
        ahead: bytearray = self.__dict__.setdefault("_read_ahead", bytearray())
        if not ahead:
            if n == 0:
                return b""
            data = await read_socket(self, max(n or 0, TCP_READ_AHEAD))
            if not ahead and (n is None or len(data) <= n):  # another reader may have left bytes while we waited
                return data
            ahead += data
        take = len(ahead) if n is None else min(n, len(ahead))
        data = bytes(ahead[:take])
        del ahead[:take]
        return data

    read.ahead = True  # type: ignore[attr-defined]
    TrioTCPStream.read = read  # type: ignore[method-assign]


SIGNED_RECORD_TTL_S = 30.0
"""How long pubsub reuses this host's signed peer record before building it again (`cache_signed_records`)."""
_SIGNED_RECORDS: weakref.WeakKeyDictionary[IHost, tuple[float, bytes]] = weakref.WeakKeyDictionary()


def cache_signed_records() -> None:
    """Make pubsub build this host's signed peer record at most every SIGNED_RECORD_TTL_S, not for every RPC.

    Why: py-libp2p's pubsub asks for the record (`env_to_send_in_RPC`) for every message it publishes or forwards
    and every control message; each call lists and compares the host's addresses (its cached record is reused, but
    finding that out is the cost), a few percent of a peer's CPU while heartbeats flowed. LeanPubsub sends the
    record only in the first RPC of each stream anyway. A record at most 30 s stale still names the same addresses
    unless they just changed, and the next one names the new ones. Applied once per process.
    """
    if getattr(pubsub_module.env_to_send_in_RPC, "cached", False):
        return
    build = pubsub_module.env_to_send_in_RPC

    def cached(host: IHost) -> tuple[bytes, bool]:
        now = trio.current_time()
        hit = _SIGNED_RECORDS.get(host)
        if hit is not None and now - hit[0] < SIGNED_RECORD_TTL_S:
            return hit[1], False
        record, created = build(host)
        _SIGNED_RECORDS[host] = (now, record)
        return record, created

    cached.cached = True  # type: ignore[attr-defined]
    pubsub_module.env_to_send_in_RPC = cached
    gossipsub_module.env_to_send_in_RPC = cached


_FUNCTION_TASKS: weakref.WeakKeyDictionary[trio.lowlevel.Task, FunctionTask] = weakref.WeakKeyDictionary()
"""trio task -> the py-libp2p FunctionTask it runs, filled as each FunctionTask learns its trio task."""


def index_service_tasks() -> None:
    """Make py-libp2p's service manager find the parent of a task it starts by a lookup instead of a walk.

    Why: `TrioManager.run_task` finds the FunctionTask whose trio task is calling it by walking every task of the
    service (`_find_parent_task`). Pubsub starts one task per received message, and its service holds a few tasks
    per connected peer, so each gossip message would pay a walk that grows with the peer's connections: about
    an eighth of a peer's CPU while gossip flows. Here each FunctionTask is indexed by its trio task when it starts;
    the parent is the indexed task if it is still in this manager's tree (each step up a child of its parent, the
    top one a root of this manager), which is what the walk finds. Applied once per process.
    """
    if getattr(TrioManager._find_parent_task, "indexed", False):
        return
    setter = FunctionTask.trio_task.fset

    def set_trio_task(self: FunctionTask, value: trio.lowlevel.Task) -> None:
        setter(self, value)
        _FUNCTION_TASKS[value] = self

    def find_parent_task(self: TrioManager, trio_task: trio.lowlevel.Task) -> FunctionTask | None:
        task = _FUNCTION_TASKS.get(trio_task)
        node = task
        while node is not None and node.parent is not None:
            if node not in node.parent.children:
                return None
            node = node.parent
        return task if node is not None and node in self._root_tasks else None

    find_parent_task.indexed = True  # type: ignore[attr-defined]
    FunctionTask.trio_task = property(FunctionTask.trio_task.fget, set_trio_task)  # type: ignore[method-assign]
    TrioManager._find_parent_task = find_parent_task  # type: ignore[method-assign]


class Libp2pByteStream:
    """A libp2p (Noise + Yamux) stream seen as a trio-style byte stream with bounded reads."""

    def __init__(self, stream: INetStream, peer_id: str, read_chunk: int = READ_CHUNK) -> None:
        self._stream = stream
        self.peer_id = peer_id
        self.transport = "libp2p-stream"
        self._read_chunk = read_chunk
        self._eof = False
        self._closed = False

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        if self._closed:
            raise trio.ClosedResourceError("data channel is closed")
        view = memoryview(data)
        try:
            for start in range(0, len(view), WRITE_CHUNK):
                await self._stream.write(bytes(view[start : start + WRITE_CHUNK]))
        except Exception as exc:  # noqa: BLE001 - libp2p raises StreamError/MuxedStreamError/... on a dead peer
            raise ChannelError(f"data stream to {self.peer_id} broke while sending ({type(exc).__name__})") from exc

    async def send_eof(self) -> None:
        """Half-close: the peer reads b"" after our data, we may still receive."""
        try:
            await self._stream.close_write()
        except Exception as exc:  # noqa: BLE001
            raise ChannelError(f"data stream to {self.peer_id} broke while closing ({type(exc).__name__})") from exc

    async def receive_some(self, max_bytes: int | None = None) -> bytes:
        if self._closed:
            raise trio.ClosedResourceError("data channel is closed")
        if self._eof:
            return b""
        limit = self._read_chunk if max_bytes is None else max(1, min(max_bytes, self._read_chunk))
        try:
            data = await self._stream.read(limit)
        except StreamEOF:
            data = b""
        except Exception as exc:  # noqa: BLE001 - a reset or a broken connection ends the stream with an error
            raise ChannelError(f"data stream from {self.peer_id} broke ({type(exc).__name__})") from exc
        if not data:
            self._eof = True
        return data

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        with trio.move_on_after(2.0) as scope:
            scope.shield = True
            try:
                await self._stream.close()
            except Exception:  # noqa: BLE001 - closing a broken stream is best effort
                log.debug("closing libp2p data stream failed", exc_info=True)
