"""The data channel's handshake on its libp2p stream: one u16-length-prefixed message each way (p2p.channel.messages
says what they hold), and closing that stream without letting its failure matter."""

from __future__ import annotations

import logging
import struct
from typing import Protocol

import trio

from p2p.channel.messages import MAX_MESSAGE, HandshakeBreach
from p2p.errors import ChannelError

log = logging.getLogger("p2p.channel")
MSG_LEN = struct.Struct(">H")


class ReadStream(Protocol):
    """What the handshake reads from: a libp2p stream (INetStream), or the fuzz bench's bytes replayed."""

    async def read(self, n: int) -> bytes: ...


class WriteStream(Protocol):
    async def write(self, data: bytes) -> None: ...


class ClosableStream(Protocol):
    async def close(self) -> None: ...


class HandshakeAbandoned(ChannelError):
    """The peer closed the handshake before sending a byte, or reset it before our answer: it gave up (done, shutting
    down, dial cancelled). Nothing hostile: logged at debug level, where a malformed handshake is a warning."""


async def write_msg(stream: WriteStream, raw: bytes) -> None:
    """Send one encoded handshake message; a stream the peer reset or closed is HandshakeAbandoned."""
    try:
        await stream.write(MSG_LEN.pack(len(raw)) + raw)
    except (trio.Cancelled, trio.TooSlowError):
        raise
    except Exception as exc:  # noqa: BLE001 - py-libp2p raises StreamReset/StreamClosed/etc. on a dying stream
        raise HandshakeAbandoned(f"data channel handshake stream gone while sending ({type(exc).__name__})") from exc


async def _read_exact(stream: ReadStream, n: int, *, opening: bool = False) -> bytes:
    """Exactly n bytes; `opening`: the first read of a handshake, where an immediate end is HandshakeAbandoned."""
    buf = bytearray()
    while len(buf) < n:
        try:
            chunk = await stream.read(n - len(buf))
        except EOFError:  # py-libp2p's StreamEOF
            chunk = b""
        if not chunk:
            if opening and not buf:
                raise HandshakeAbandoned("the peer closed the handshake stream before sending anything")
            raise ChannelError("handshake stream ended early")
        buf += chunk
    return bytes(buf)


async def read_msg(stream: ReadStream, *, opening: bool = False) -> bytes:
    """One handshake message's bytes, its length checked before they are read (the decoders check the rest)."""
    try:
        (size,) = MSG_LEN.unpack(await _read_exact(stream, MSG_LEN.size, opening=opening))
        if size > MAX_MESSAGE:
            raise HandshakeBreach(f"handshake message of {size} bytes exceeds {MAX_MESSAGE}")
        return await _read_exact(stream, size)
    except ChannelError:
        raise
    except Exception as exc:  # noqa: BLE001 - EOF, reset or garbage: all mean a failed handshake
        raise ChannelError(f"bad data channel handshake ({type(exc).__name__})") from exc


async def close_quietly(stream: ClosableStream) -> None:
    with trio.move_on_after(1.0):
        try:
            await stream.close()
        except Exception:  # noqa: BLE001 - the offer already arrived; a close failure changes nothing
            log.debug("closing the handshake stream failed", exc_info=True)
