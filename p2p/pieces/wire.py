"""The piece protocol: framing and message types.

Rules of this module: pure bytes in, bytes out; no sockets, no clocks. The only IO is the two tiny async helpers
at the bottom, which work over any trio-style stream (the contract shared by the libp2p streams and memnet):

    async send_all(data) ; async receive_some(max_bytes) -> bytes (b"" at EOF) ; async aclose()

Frame layout (all lengths 4-byte big-endian):

    | header_len | msgpack header (a dict, "t" = type) | payload_len | payload bytes (piece data, else empty) |

Why a separate raw payload instead of msgpack bin: a 1 MiB piece is never re-encoded or copied by msgpack, and the
header of every frame is bounded (64 KiB) before we read a single byte of its payload, so a hostile peer cannot make
us buffer more than one declared, size-checked frame.

Message types (pieces use one global numbering over all the manifest's files, in manifest order):

    hello     {t, manifest_id: bytes32, bitfield: bytes}  first frame on a link, both directions
    bitfield  {t, bits: bytes}                             full replacement of the sender's have-map
    have      {t, index}                                   sender verified piece `index`
    request   {t, index}                                   please send piece `index`
    cancel    {t, index}                                   forget my request for `index` (endgame)
    piece     {t, index} + payload                         the bytes of piece `index`
    reject    {t, index, reason: str}                      will not send `index` (busy, missing, ...)

Bitfields are MSB-first: piece i is bit (7 - i % 8) of byte i // 8; trailing bits must be zero.
`parse_message` turns a decoded frame into one of the frozen message classes and rejects anything else.
"""

from __future__ import annotations

import struct
from collections import deque
from dataclasses import dataclass
from typing import Protocol, Union

import msgpack
import numpy as np

from p2p.errors import FrameError, FrameTruncatedError

MAX_HEADER = 64 * 1024
MAX_PAYLOAD = 16 * 1024 * 1024
RECEIVE_CHUNK = 1024 * 1024
"""Bytes asked of a stream per read: one whole data-channel record (channel_records.MAX_RECORD), so a record that
carries a 1 MiB piece payload is handed over as one object, never sliced into copies."""
_LEN = struct.Struct(">I")
_JOIN_BELOW = 64 * 1024  # payloads smaller than this are joined with the header into one send


class Stream(Protocol):
    """The byte-stream contract between the piece protocol and every transport (libp2p, memnet)."""

    async def send_all(self, data: bytes | bytearray | memoryview) -> None: ...

    # optional: `async send_parts(parts)` sends the concatenation of parts; the data channel seals a frame's
    # header and payload that way without copying the payload, and sends them together (see `send_buffers`)

    async def receive_some(self, max_bytes: int | None = None) -> bytes | bytearray: ...

    async def aclose(self) -> None: ...


# ---------------------------------------------------------------------------------------------- framing


def encode_frame(header: dict, payload: bytes | bytearray | memoryview = b"") -> list[bytes | memoryview]:
    """Encode one frame as a list of buffers to send in order (the payload is never copied)."""
    head = msgpack.packb(header, use_bin_type=True)
    if len(head) > MAX_HEADER:
        raise FrameError(f"frame header of {len(head)} bytes exceeds {MAX_HEADER}")
    size = len(payload)
    prefix = _LEN.pack(len(head)) + head + _LEN.pack(size)
    if size == 0:
        return [prefix]
    if size < _JOIN_BELOW:
        return [prefix + bytes(payload)]
    return [prefix, memoryview(payload)]


class FrameDecoder:
    """Sans-IO incremental decoder: feed chunks as they arrive, pop whole frames.

    Why it keeps the fed chunks instead of copying them into a buffer: at 1 MiB pieces the copies were the cost
    (about three per frame held the piece protocol to 0.38x of raw TCP). A payload that lies inside one chunk is
    handed out as the chunk itself when it is exactly the payload (the data channel seals a big payload as its own
    record), else as a memoryview of that chunk; only a payload spread over several chunks (raw TCP, memnet) is
    joined, once. Sizes are checked as soon as each length prefix is complete, so an oversized frame is refused
    before its body is waited for. The decoder keeps references to what it is fed: callers (every Stream's
    `receive_some`) must hand over buffers they will not reuse.
    """

    def __init__(self, max_header: int = MAX_HEADER, max_payload: int = MAX_PAYLOAD) -> None:
        self.max_header = max_header
        self.max_payload = max_payload
        self._chunks: deque[bytes | bytearray] = deque()  # fed, not yet returned; the first from `_offset` on
        self._offset = 0
        self._size = 0  # bytes in `_chunks` past `_offset`
        self._header: dict | None = None  # parsed header of the frame whose payload is awaited
        self._plen = 0

    @property
    def buffered(self) -> int:
        """Bytes received but not yet returned as a frame (the current frame's prefix excluded)."""
        return self._size

    def feed(self, data: bytes | bytearray | memoryview) -> None:
        if isinstance(data, memoryview):  # a view may be of a buffer its owner reuses: keep our own copy
            data = data.tobytes()
        if data:
            self._chunks.append(data)
            self._size += len(data)

    def next_frame(self) -> tuple[dict, bytes | bytearray | memoryview] | None:
        """Return (header, payload) for the next complete frame, or None if more bytes are needed."""
        if self._header is None and not self._parse_prefix():
            return None
        if self._size < self._plen:
            return None
        frame = (self._header, self._take(self._plen))
        self._header, self._plen = None, 0
        return frame

    def _parse_prefix(self) -> bool:
        if self._size < 4:
            return False
        hlen = _LEN.unpack(self._peek(4))[0]
        if hlen == 0 or hlen > self.max_header:
            raise FrameError(f"frame header length {hlen} is outside 1..{self.max_header}")
        if self._size < 8 + hlen:
            return False
        prefix = self._take(8 + hlen)
        plen = _LEN.unpack_from(prefix, 4 + hlen)[0]
        if plen > self.max_payload:
            raise FrameError(f"frame payload of {plen} bytes exceeds {self.max_payload}")
        self._header, self._plen = _decode_header(bytes(prefix[4 : 4 + hlen])), plen
        return True

    def _views(self, n: int) -> list[memoryview]:
        """Views of the next `n` buffered bytes (n <= buffered), first chunk first."""
        views, offset, need = [], self._offset, n
        for chunk in self._chunks:
            view = memoryview(chunk)[offset : offset + need]
            views.append(view)
            need -= len(view)
            offset = 0
            if not need:
                break
        return views

    def _peek(self, n: int) -> bytes:
        return b"".join(self._views(n))

    def _take(self, n: int) -> bytes | bytearray | memoryview:
        """Remove and return the next `n` bytes: the chunk or a view of it when they lie in one, else one join."""
        if n == 0:
            return b""
        first, offset = self._chunks[0], self._offset
        if offset + n <= len(first):
            out = first if offset == 0 and n == len(first) else memoryview(first)[offset : offset + n]
        else:
            out = b"".join(self._views(n))
        self._size -= n
        left = n + offset
        while left and left >= len(self._chunks[0]):
            left -= len(self._chunks.popleft())
        self._offset = left
        return out

    def eof(self) -> None:
        """Call at end of stream: a partial frame left over means the peer truncated it."""
        if self._header is not None or self._size:
            raise FrameTruncatedError(f"stream ended inside a frame ({self._size} bytes left over)")


def _decode_header(raw: bytes) -> dict:
    try:
        header = msgpack.unpackb(raw, raw=False, strict_map_key=True)
    except Exception as exc:  # msgpack raises many unrelated types on garbage
        raise FrameError(f"frame header is not valid msgpack ({type(exc).__name__})") from None
    if not isinstance(header, dict) or not isinstance(header.get("t"), str):
        raise FrameError("frame header is not a map with a string 't' field")
    return header


# ---------------------------------------------------------------------------------------------- messages


@dataclass(frozen=True)
class Hello:
    """First frame on a link: which manifest the sender talks about and which pieces it holds."""

    manifest_id: bytes
    bitfield: bytes


@dataclass(frozen=True)
class Bitfield:
    """Full replacement of the sender's have-map."""

    bits: bytes


@dataclass(frozen=True)
class Have:
    """The sender has just verified piece `index`."""

    index: int


@dataclass(frozen=True)
class Request:
    """Please send piece `index`."""

    index: int


@dataclass(frozen=True)
class Cancel:
    """Forget an earlier request for piece `index`."""

    index: int


@dataclass(frozen=True)
class Piece:
    """The bytes of piece `index` (unverified until hashed against the manifest)."""

    index: int
    data: bytes | bytearray | memoryview  # received: the chunk or a read-only view of it, uncopied


@dataclass(frozen=True)
class Reject:
    """The sender will not serve piece `index`; `reason` is for logs, except "busy" (p2p/pieces/engine.py BUSY): the
    sender still holds the piece and is loaded, so ask another holder for now."""

    index: int
    reason: str


Message = Union[Hello, Bitfield, Have, Request, Cancel, Piece, Reject]
_INDEXED = {"have": Have, "request": Request, "cancel": Cancel}


def _index(header: dict, num_pieces: int) -> int:
    index = header.get("index")
    if type(index) is not int or not 0 <= index < num_pieces:
        raise FrameError(f"piece index {index!r} is outside 0..{num_pieces - 1}")
    return index


def _bits(value: object, num_pieces: int) -> bytes:
    if not isinstance(value, bytes) or len(value) != (num_pieces + 7) // 8:
        raise FrameError("bitfield has the wrong type or length")
    spare = len(value) * 8 - num_pieces
    if spare and value[-1] & ((1 << spare) - 1):
        raise FrameError("bitfield has bits set past the last piece")
    return value


def parse_message(header: dict, payload: bytes | bytearray | memoryview, num_pieces: int) -> Message:
    """Validate a decoded frame against a manifest of `num_pieces` pieces and build its typed message."""
    kind = header["t"]
    if kind != "piece" and payload:
        raise FrameError(f"control message {kind!r} carries a payload")
    if kind in _INDEXED:
        return _INDEXED[kind](_index(header, num_pieces))
    if kind == "piece":
        return Piece(_index(header, num_pieces), payload)
    if kind == "hello":
        mid = header.get("manifest_id")
        if not isinstance(mid, bytes) or len(mid) != 32:
            raise FrameError("hello carries no 32-byte manifest id")
        return Hello(mid, _bits(header.get("bitfield"), num_pieces))
    if kind == "bitfield":
        return Bitfield(_bits(header.get("bits"), num_pieces))
    if kind == "reject":
        reason = header.get("reason", "")
        if not isinstance(reason, str) or len(reason) > 200:
            raise FrameError("reject reason is not a short string")
        return Reject(_index(header, num_pieces), reason)
    raise FrameError(f"unknown message type {kind!r}")


def decode_frames(data: bytes | bytearray, num_pieces: int) -> list[Message]:
    """Every message of a whole piece-protocol byte stream, in order, against a manifest of `num_pieces` pieces:
    the framing and message checks of a live link in one call; FrameError (and nothing else) on any defect."""
    decoder = FrameDecoder()
    decoder.feed(bytes(data))
    messages = []
    while (frame := decoder.next_frame()) is not None:
        messages.append(parse_message(*frame, num_pieces))
    decoder.eof()
    return messages


def message_frame(msg: Message) -> list[bytes | memoryview]:
    """Encode a typed message as frame buffers."""
    if isinstance(msg, Piece):
        return encode_frame({"t": "piece", "index": msg.index}, msg.data)
    if isinstance(msg, Hello):
        return encode_frame({"t": "hello", "manifest_id": msg.manifest_id, "bitfield": msg.bitfield})
    if isinstance(msg, Bitfield):
        return encode_frame({"t": "bitfield", "bits": msg.bits})
    if isinstance(msg, Reject):
        return encode_frame({"t": "reject", "index": msg.index, "reason": msg.reason})
    kind = {Have: "have", Request: "request", Cancel: "cancel"}[type(msg)]
    return encode_frame({"t": kind, "index": msg.index})


# ---------------------------------------------------------------------------------------------- bitfields


def pack_bits(have: list[bool] | bytearray | bytes) -> bytes:
    """Pack a sequence of truthy flags, MSB-first, into a bitfield."""
    out = bytearray((len(have) + 7) // 8)
    for i, flag in enumerate(have):
        if flag:
            out[i >> 3] |= 0x80 >> (i & 7)
    return bytes(out)


def unpack_bits(bits: bytes, num_pieces: int) -> bytearray:
    """Unpack a bitfield into a bytearray of 0/1 flags, one per piece (vectorised: a Python loop per piece cost
    milliseconds per bitfield of a large policy, and a peer may send many)."""
    flags = np.unpackbits(np.frombuffer(bytes(bits), dtype=np.uint8), count=num_pieces)
    return bytearray(flags.tobytes())


# ---------------------------------------------------------------------------------------------- stream IO


async def send_buffers(stream: Stream, parts: list[bytes | memoryview]) -> None:
    """Send buffers in order, in one `send_parts` call where the stream has one (the data channel: one record)."""
    send_parts = getattr(stream, "send_parts", None)
    if send_parts is not None:
        await send_parts(parts)
        return
    for part in parts:
        await stream.send_all(part)


async def write_frame(stream: Stream, header: dict, payload: bytes | bytearray | memoryview = b"") -> None:
    """Send one frame; big payloads go out as their own buffer, never copied by the framing."""
    await send_buffers(stream, encode_frame(header, payload))


async def read_frame(
    stream: Stream, decoder: FrameDecoder, chunk: int = RECEIVE_CHUNK
) -> tuple[dict, bytes | bytearray | memoryview] | None:
    """Read until one whole frame is decoded; None at a clean end of stream, FrameError at a truncated one."""
    while True:
        frame = decoder.next_frame()
        if frame is not None:
            return frame
        data = await stream.receive_some(chunk)
        if not data:
            decoder.eof()
            return None
        decoder.feed(data)
