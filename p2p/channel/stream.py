"""The IO adapter of the fast data channel: sealed records over a plain trio TCP socket.

Why `recv_into` reads into preallocated buffers: the trio scheduler around many small reads, and copies, are where
stream throughput goes in Python (docs/reference.md#py-libp2p-pitfalls). A read also takes up to READ_AHEAD bytes past
the record it completes when they are already there (never waited for), so a piece frame's small header record arrives
with the end of the previous payload instead of costing a read of its own; we never wait for bytes the peer has not sent
(which would stall request/response traffic). Sending mirrors it: `send_parts` seals a frame's header record and payload
record back to back in the output buffer and hands them to the socket in one send.

Timeouts: a record whose header arrived must complete within `record_timeout` (a peer cannot pin our buffer by
stalling mid-record); between records a link may idle unless `idle_timeout` is set, while TCP keepalive still
detects a peer whose machine vanished; each record sent must be taken by the peer within `send_timeout`.
"""

from __future__ import annotations

import logging
import socket as stdlib_socket
from contextlib import nullcontext
from dataclasses import dataclass

import trio

from p2p.budget import NODE_BUDGET, MemoryBudget
from p2p.channel.records import (
    COPY_LIMIT,
    HEADER,
    RECORD_BYTES,
    TAG,
    PlaintextPool,
    RecordOpener,
    RecordSealer,
    split_records,
)
from p2p.errors import ChannelError

log = logging.getLogger(__name__)
_SMALL_RECORDS = 2 * COPY_LIMIT
READ_AHEAD = 64 * 1024
"""Bytes a read may take past the record it completes, when they are already there: a piece frame's small header
record then comes in with the end of the previous piece's payload record, not in a read of its own."""
FIRST_BUFFER = HEADER.size + COPY_LIMIT + TAG + READ_AHEAD
"""Bytes each direction's buffer starts with: records of up to COPY_LIMIT bytes (requests, haves, frame headers)
and a read-ahead. A buffer grows to full size (a MAX_RECORD record and a read-ahead, or small records sealed ahead
of one) the first time a record needs it. Why not full size from the start: peers open a channel per link and
spare for every version, most of which never carry a piece; at 2.3 MiB a channel, allocating and zeroing both
buffers would be 7 % of `swarm sim`'s event loop (py-spy), and a seed serving many peers would hold that much per
channel."""
_FULL_OUT = RECORD_BYTES + _SMALL_RECORDS
_FULL_IN = RECORD_BYTES + READ_AHEAD
SHRINK_AFTER = 2.0
"""Seconds a channel whose buffers grew to full size may idle before they shrink back to FIRST_BUFFER: idle links
(and strangers' channels that sent one big record) then hold 0.25 MiB each instead of 2.3 MiB, while a transfer
in progress, whose records come back to back, never pays for it."""


@dataclass(frozen=True)
class StreamTimeouts:
    """Per-operation limits of one data channel stream, in seconds of trio time."""

    record_timeout: float = 30.0
    """A record whose header arrived must be complete within this."""
    idle_timeout: float | None = None
    """Longest wait for the next record; None lets a link idle (the piece protocol keeps links open)."""
    send_timeout: float = 30.0
    """A record handed to the socket must be taken by the peer within this (a receiver that stopped reading)."""


KEEPALIVE = ((getattr(stdlib_socket, "TCP_KEEPIDLE", None), 30), (getattr(stdlib_socket, "TCP_KEEPINTVL", None), 10),
             (getattr(stdlib_socket, "TCP_KEEPCNT", None), 3))
"""A peer whose machine vanished (no FIN, no RST) is detected by the kernel after about 60 s of silence."""


def tune_socket(stream: trio.SocketStream, buffer_bytes: int) -> None:
    """TCP keepalive on every data socket; fixed kernel buffers only when asked (0 keeps autotuning)."""
    options = [(stdlib_socket.SOL_SOCKET, stdlib_socket.SO_KEEPALIVE, 1)]
    options += [(stdlib_socket.IPPROTO_TCP, opt, value) for opt, value in KEEPALIVE if opt is not None]
    if buffer_bytes:
        options += [
            (stdlib_socket.SOL_SOCKET, opt, buffer_bytes) for opt in (stdlib_socket.SO_SNDBUF, stdlib_socket.SO_RCVBUF)
        ]
    for level, option, value in options:
        try:
            stream.setsockopt(level, option, value)
        except OSError:  # an unsupported option or a kernel cap is not an error: the defaults still work
            log.debug("could not set socket option %s", option, exc_info=True)


class SecureChannelStream:
    """A trio-style byte stream (send_all / receive_some / aclose) of authenticated, encrypted records."""

    def __init__(
        self,
        stream: trio.SocketStream,
        sealer: RecordSealer,
        opener: RecordOpener,
        peer_id: str,
        timeouts: StreamTimeouts = StreamTimeouts(),
        budget: MemoryBudget = NODE_BUDGET,
    ) -> None:
        self._stream = stream
        self._sock = stream.socket
        self._sealer = sealer
        self._opener = opener
        self.peer_id = peer_id
        self.transport = "data-socket"
        self.aead = sealer.aead
        self._timeouts = timeouts
        self._out = bytearray(FIRST_BUFFER)  # sealed records waiting for one send (grows, see FIRST_BUFFER)
        self._in = bytearray(FIRST_BUFFER)  # a record, and what a read may take past it (grows likewise)
        self._carry = 0  # bytes received at the start of self._in: the next record's header, and maybe more
        self._plain: bytes | bytearray = b""
        self._plain_pos = 0
        self._pool = PlaintextPool()  # big records decrypt into reused buffers (PlaintextPool says who owns them)
        self._send_lock = trio.Lock()
        # a record whose header declared more bytes than have come holds them on the node's budget until its tag
        # is checked: a stranger's channels stalling mid-record together hold at most that budget
        self._record_lease = budget.lease("a data channel record")
        self._receiving = False
        self._broken: ChannelError | None = None
        self._closed = False

    # ------------------------------------------------------------------------------------------------ sending

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        """Send `data` as records of at most MAX_RECORD bytes (one record per call below that size)."""
        await self.send_parts([data])

    async def send_parts(self, parts: list[bytes | bytearray | memoryview]) -> None:
        """Send the concatenation of `parts`: small parts share a record, a big one is sealed where it lies.

        A piece frame becomes a tiny header record and a payload record (`split_records`); both are handed to the
        socket in one send, and the reader takes the second header along with the first body.
        """
        self._check_usable()
        views = [memoryview(part).cast("B") for part in parts]
        async with self._send_lock:
            filled = 0
            for group in split_records(views):
                need = HEADER.size + sum(len(v) for v in group) + TAG
                if filled + need > len(self._out):
                    await self._flush(filled)
                    filled = 0
                    if need > len(self._out):
                        self._out = bytearray(_FULL_OUT)
                filled += self._sealer.seal_parts_into(group, memoryview(self._out)[filled:])
            await self._flush(filled)

    async def _send_record(self, parts: list[memoryview] | list[bytes], final: bool) -> None:
        await self._flush(self._sealer.seal_parts_into(parts, self._out, final=final))

    async def _flush(self, size: int) -> None:
        """Hand the first `size` bytes of sealed records in the output buffer to the socket."""
        if not size:
            return
        try:
            with trio.fail_after(self._timeouts.send_timeout):
                await self._stream.send_all(memoryview(self._out)[:size])
        except trio.TooSlowError as exc:
            raise self._fail(f"peer {self.peer_id} stopped taking data for {self._timeouts.send_timeout:g} s") from exc
        except (trio.BrokenResourceError, OSError) as exc:
            raise self._fail(f"data channel to {self.peer_id} broke while sending") from exc

    async def send_eof(self) -> None:
        """Half-close: send the final record; the peer reads b"" after our data, we may still receive."""
        self._check_usable()
        async with self._send_lock:
            if not self._sealer.finished:
                await self._send_record([], final=True)

    # ---------------------------------------------------------------------------------------------- receiving

    async def receive_some(self, max_bytes: int | None = None) -> bytes | bytearray:
        """Up to `max_bytes` of plaintext (b"" after the peer's final record); ChannelError on tampering/truncation."""
        self._check_usable()
        if self._receiving:
            raise trio.BusyResourceError("another task is already receiving on this data channel")
        self._receiving = True
        try:
            while self._plain_pos == len(self._plain):
                self._plain, self._plain_pos = b"", 0  # a spent record must not keep its pooled buffer busy
                if self._opener.finished:
                    return b""
                self._plain = await self._read_record()
            return self._take(len(self._plain) if max_bytes is None else max(1, max_bytes))
        finally:
            self._receiving = False

    def _take(self, limit: int) -> bytes | bytearray:
        """Hand out buffered plaintext: a whole record without copying when the caller's limit allows it.

        A whole record is handed over, not shared: the stream drops its own reference, so a pooled buffer is
        reused only after the caller (and whoever it passed the buffer to) let go of it. Callers own what they get.
        """
        start, end = self._plain_pos, min(len(self._plain), self._plain_pos + limit)
        if start == 0 and end == len(self._plain):
            record, self._plain, self._plain_pos = self._plain, b"", 0
            return record
        self._plain_pos = end
        with memoryview(self._plain) as view:
            return bytes(view[start:end])

    async def send_accept(self) -> None:
        """The listener's empty first record: proves it holds the key and admitted the token."""
        async with self._send_lock:
            await self._send_record([], final=False)

    async def receive_accept(self) -> None:
        """Consume the listener's empty 'accepted' record (the handshake's last step)."""
        if await self._read_record() != b"" or self._opener.finished:
            raise self._fail(f"peer {self.peer_id} did not accept the data channel")

    async def _read_record(self) -> bytes:
        try:
            length, flags = await self._read_header()
            end = HEADER.size + length
            if self._carry < end:  # else the whole record came with earlier reads: nothing to wait for
                self._record_lease.resize(end - self._carry)
                try:
                    with trio.move_on_after(self._timeouts.record_timeout) as scope:
                        await self._read_body(length)
                finally:
                    self._record_lease.close()
                if scope.cancelled_caught:
                    raise trio.TooSlowError
            plaintext = self._opener.open(flags, memoryview(self._in)[HEADER.size : end], self._pool)
            self._keep_read_ahead(end)
            return plaintext
        except ChannelError as exc:
            self._fail(str(exc))
            raise
        except trio.TooSlowError as exc:
            raise self._fail(f"data channel from {self.peer_id} stalled (no data within the timeout)") from exc
        except (trio.BrokenResourceError, OSError) as exc:
            raise self._fail(f"data channel from {self.peer_id} broke ({type(exc).__name__})") from exc

    async def _read_header(self) -> tuple[int, int]:
        """The next record's (length, flags); its bytes often came with an earlier read (no syscall then)."""
        if self._carry < HEADER.size:
            with trio.fail_after(self._timeouts.idle_timeout) if self._timeouts.idle_timeout else nullcontext():
                if not self._carry and len(self._in) > FIRST_BUFFER:
                    await self._shrink_when_idle()
                area = memoryview(self._in)[: HEADER.size + READ_AHEAD]
                self._carry = await self._recv_at_least(area, self._carry, HEADER.size)
            if self._carry == 0:
                raise self._fail(f"data channel from {self.peer_id} ended without its final record (truncated)")
            if self._carry < HEADER.size:
                raise self._fail(f"data channel from {self.peer_id} ended inside a record header (truncated)")
        return self._opener.parse_header(memoryview(self._in)[: HEADER.size])

    async def _shrink_when_idle(self) -> None:
        """Wait up to SHRINK_AFTER for the next record (nothing is read here); if none comes, shrink the buffers."""
        with trio.move_on_after(SHRINK_AFTER):
            await trio.lowlevel.wait_readable(self._sock)
            return
        self._in, self._pool = bytearray(FIRST_BUFFER), PlaintextPool()
        if not self._send_lock.locked():  # a send in progress keeps its buffer; it grows again on demand anyway
            self._out = bytearray(FIRST_BUFFER)

    async def _read_body(self, length: int) -> None:
        """Complete the body at self._in[HEADER.size:], taking at most READ_AHEAD bytes past it that are already
        there (never waiting for them)."""
        end = HEADER.size + length
        if end + READ_AHEAD > len(self._in):  # the first big record: the buffer grows once, keeping what came ahead
            grown = bytearray(_FULL_IN)
            grown[: self._carry] = self._in[: self._carry]
            self._in = grown
        if self._carry < end:
            self._carry = await self._recv_at_least(memoryview(self._in)[: end + READ_AHEAD], self._carry, end)
        if self._carry < end:
            raise self._fail(f"data channel from {self.peer_id} ended inside a record (truncated)")

    def _keep_read_ahead(self, end: int) -> None:
        """Move what was read past the record just opened (at most READ_AHEAD bytes) to the front."""
        self._carry -= end
        if self._carry:
            self._in[: self._carry] = self._in[end : end + self._carry]  # the slice is a copy: overlap is safe

    async def _recv_at_least(self, view: memoryview, got: int, minimum: int) -> int:
        """Read into `view` from offset `got` until at least `minimum` bytes are there; fewer only at EOF.

        Each read takes whatever the socket holds up to the end of `view`, so it never waits for bytes past
        `minimum`: reading a little ahead (the next header) saves a read per record, and never stalls a link.
        """
        while got < minimum:
            n = await self._sock.recv_into(view[got:])
            if n == 0:
                break
            got += n
        return got

    # ------------------------------------------------------------------------------------------------ closing

    async def aclose(self) -> None:
        """Send the final record (a clean end the peer can tell from truncation), then close the socket."""
        if self._closed:
            return
        self._closed = True
        with trio.move_on_after(2.0) as scope:
            scope.shield = True
            if self._broken is None and not self._sealer.finished:
                try:
                    async with self._send_lock:
                        await self._send_record([], final=True)
                except (ChannelError, trio.ClosedResourceError):
                    log.debug("final record not delivered to %s", self.peer_id)
        await trio.aclose_forcefully(self._stream)
        self._release_buffers()

    async def abort(self) -> None:
        """Close the socket without a final record: the peer sees a truncation (used on errors)."""
        self._closed = True
        await trio.aclose_forcefully(self._stream)
        self._release_buffers()

    def _release_buffers(self) -> None:
        """Let go of the record buffers at once: a failed channel's error refers back to the stream through its
        traceback, so the stream itself lives until a full garbage collection, and it held 2-5 MiB until then."""
        self._in, self._out, self._carry = bytearray(), bytearray(), 0
        self._plain, self._plain_pos, self._pool = b"", 0, PlaintextPool()

    def _check_usable(self) -> None:
        if self._closed:
            raise trio.ClosedResourceError("data channel is closed")
        if self._broken is not None:
            raise ChannelError(f"data channel is broken: {self._broken}")

    def _fail(self, message: str) -> ChannelError:
        """Mark the stream broken: after a bad record nothing more from this peer can be trusted."""
        if self._broken is None:
            self._broken = ChannelError(message)
        return self._broken
