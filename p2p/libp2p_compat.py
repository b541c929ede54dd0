"""Adapters from py-libp2p streams to the trio-style byte-stream contract, plus the measured Yamux tuning
(docs/reference.md#py-libp2p-pitfalls) and the pubsub subclasses that keep gossip's CPU cost from starving every other
stream (`LeanGossipSub`, `LeanPubsub`).

The contract (p2p/wire.py's `Stream`): `send_all(data)`, `receive_some(max_bytes) -> bytes` (b"" at EOF),
`aclose()`. A libp2p stream is the fallback transport of the data channel when a peer's data socket cannot be
reached (relays, NAT): slower (about 0.25x of raw TCP) but always available.
"""

from __future__ import annotations

import logging
import os
import time
import weakref
from typing import Any

import trio
from libp2p.network.stream.exceptions import StreamEOF
from libp2p.pubsub import gossipsub as gossipsub_module
from libp2p.pubsub import pubsub as pubsub_module
from libp2p.pubsub.gossipsub import GossipSub
from libp2p.pubsub.pb import rpc_pb2
from libp2p.pubsub.pubsub import Pubsub
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
IDONTWANT_MIN_BYTES = 1024
"""Smallest message worth an IDONTWANT (go-libp2p's IDontWantMessageThreshold): below it the control RPC costs as
much as the duplicate it would save."""


def tune_yamux() -> None:
    """Apply the measured Yamux tuning once per process.

    - PY_YAMUX_RELEASE_ON_READ=0 (read by py-libp2p at call time): window credit is released in batches, 37x
      fewer window-update frames. Set only if the user has not chosen a value.
    - MAX_MESSAGE_SIZE is a module constant py-libp2p reads on every write; it has no setter, so we assign it:
      frames of 65,519 bytes travel as one Noise message instead of two. It changes only the sender's framing,
      which every Yamux peer accepts.
    """
    os.environ.setdefault("PY_YAMUX_RELEASE_ON_READ", "0")
    if yamux.MAX_MESSAGE_SIZE > NOISE_SIZED_YAMUX_FRAME:
        yamux.MAX_MESSAGE_SIZE = NOISE_SIZED_YAMUX_FRAME
    if not getattr(yamux.YamuxStream._auto_tune_and_send_window_update, "at_half", False):
        yamux.YamuxStream._auto_tune_and_send_window_update = grant_window_at_half  # type: ignore[method-assign]
    if not getattr(yamux.Yamux._write_frame, "lean", False):
        yamux.Yamux._write_frame = write_frame  # type: ignore[method-assign]


async def grant_window_at_half(stream: Any, *, bytes_read: int = 0) -> None:
    """Send a Yamux WINDOW_UPDATE once the credit owed reaches half the receive window (go-yamux's rule), or at
    any read while the sender has less than one frame of credit left.

    Why: py-libp2p 0.8.1 also grants "partial slack", the bytes of every read of a stream whose owed credit is
    below that half, so each small gossip message read cost the reader a window-update frame (one Noise message and
    one socket write): a third of the frames a peer sent while heartbeats flowed. The credit owed is what was read
    and not yet granted back. The second condition is for slow readers: py-libp2p's writer gives up and resets the
    stream after 5 s without credit, so a sender that has used its window is granted what each read frees.
    """
    async with stream.window_lock:
        buffered = len(stream.conn.stream_buffers.get(stream.stream_id, b""))
        owed = stream.target_recv_window - (stream.recv_window + buffered)
        starved = stream.recv_window < yamux.MAX_MESSAGE_SIZE
        if owed <= 0 or (owed < stream._grow_threshold() and not starved):
            return
        grant = stream._grow_to_delta(buffered) + stream._apply_autotune_epoch(buffered)
    if grant > 0:
        await stream.send_window_update(grant, skip_lock=True)


grant_window_at_half.at_half = True  # type: ignore[attr-defined]


async def write_frame(conn: Any, data: bytes) -> None:
    """py-libp2p's `Yamux._write_frame` without its debug line, which it formats for every frame whether debug
    logging is on or not (an unpack of the header and an f-string, about a tenth of a small frame's cost)."""
    async with conn._write_lock:
        await conn.secured_conn.write(data)
    await trio.lowlevel.checkpoint()


write_frame.lean = True  # type: ignore[attr-defined]


SIGNED_RECORD_TTL_S = 30.0
"""How long pubsub reuses this host's signed peer record before building it again (`cache_signed_records`)."""
_SIGNED_RECORDS: weakref.WeakKeyDictionary[Any, tuple[float, bytes]] = weakref.WeakKeyDictionary()


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

    def cached(host: Any) -> tuple[bytes, bool]:
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


_FUNCTION_TASKS: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()
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

    def set_trio_task(self: Any, value: Any) -> None:
        setter(self, value)
        _FUNCTION_TASKS[value] = self

    def find_parent_task(self: Any, trio_task: Any) -> Any:
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


class LeanGossipSub(GossipSub):
    """py-libp2p 0.8.1's GossipSub minus most of its CPU per gossip message (with LeanPubsub: less than half).

    Why: every RPC costs about 2.5 ms of CPU in py-libp2p, and all hosts of a process share one trio thread. With
    6 fully meshed hosts each publishing one small heartbeat a second, py-libp2p spent about 140 ms of CPU per
    publish (55 RPCs: 25 forwards and 30 IDONTWANTs, each carrying a signed peer record that the receiver verifies
    twice). Past the CPU the process gets, inbound bytes pile up in the sockets and a new stream's SYN and
    protocol negotiation wait behind that backlog: opening any stream took 8-10 s, then timed out.
    IDONTWANT is sent for every message received, whatever its size: only for messages of IDONTWANT_MIN_BYTES
    and more here, as go-libp2p does (large rollout messages keep the saving).
    """

    async def _emit_idontwant_for_message(self, msg_id: bytes, topic_ids: Any) -> None:
        message = self.mcache.get(msg_id)  # put there just before, under the same (from, seqno) id
        if message is not None and len(message.data) < IDONTWANT_MIN_BYTES:
            return
        await super()._emit_idontwant_for_message(msg_id, topic_ids)


class LeanPubsub(Pubsub):
    """py-libp2p's Pubsub that sends its signed peer record once per stream (its first RPC, the subscription
    hello), which keeps the peer's certified address book fed, instead of on every RPC, where the receiver
    verifies it twice (LeanGossipSub says what that cost)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._record_sent: weakref.WeakSet[Any] = weakref.WeakSet()

    async def write_msg(self, stream: Any, rpc_msg: Any) -> bool:
        if rpc_msg.HasField("senderRecord"):
            if stream in self._record_sent:
                slim = rpc_pb2.RPC()
                slim.CopyFrom(rpc_msg)  # the same RPC object goes to other peers: never edit it in place
                slim.ClearField("senderRecord")
                rpc_msg = slim
            else:
                self._record_sent.add(stream)
        return await super().write_msg(stream, rpc_msg)

    def _next_seqno(self) -> bytes:
        self.counter = next_seqno(self.counter, time.time())
        return self.counter.to_bytes(8, "big")


class BufferedInboundStream:
    """An inbound pubsub stream read in large chunks; every other attribute is the wrapped stream's.

    Why: py-libp2p reads a gossip RPC one byte per varint byte and then its body, and every read of a Yamux stream
    takes the connection's stream lock and re-checks the receive window (sometimes sending a window update). In
    `swarm sim`, whose hosts share one trio thread, those reads and window checks were about a fifth of that
    thread's time. Here one Yamux read takes everything buffered (up to `chunk` bytes) and the varint and body are
    served from it. Only reads are buffered; reset, close and the connection pass through unchanged.
    """

    def __init__(self, stream: Any, chunk: int = 64 * 1024) -> None:
        self._stream = stream
        self._chunk = chunk
        self._buffer = bytearray()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)

    async def read(self, n: int | None = -1) -> bytes:
        if n is None or n < 0:  # "everything until EOF": hand over what is buffered first, then pass through
            if self._buffer:
                data, self._buffer = bytes(self._buffer), bytearray()
                return data
            return await self._stream.read(n)
        if not self._buffer:
            data = await self._stream.read(max(n, self._chunk))
            if len(data) <= n:  # no copy into the buffer when the read is consumed whole (and b"" at EOF)
                return data
            self._buffer += data
        data = bytes(self._buffer[:n])
        del self._buffer[:n]
        return data


def next_seqno(previous: int, now: float) -> int:
    """The next pubsub sequence number: past the previous one and never below the wall clock in microseconds.

    Why: py-libp2p starts its counter at the clock in whole seconds and adds one per message, so a peer that sent
    more messages than seconds passed and restarted under the same key would reuse its earlier (from, seqno) ids,
    which every receiver's seen-cache drops as duplicates: an inference peer restarted after 34 s and 60 messages
    would go unheard for over a minute, its rollouts lost. In microseconds a restart always starts past them.
    """
    return max(previous + 1, int(now * 1e6))


class Libp2pByteStream:
    """A libp2p (Noise + Yamux) stream seen as a trio-style byte stream with bounded reads."""

    def __init__(self, stream: Any, peer_id: str, read_chunk: int = READ_CHUNK) -> None:
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
