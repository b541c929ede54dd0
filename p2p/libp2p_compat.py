"""Adapters from py-libp2p streams to the trio-style byte-stream contract, plus the Yamux tuning REFERENCE §5 measured.

The contract (p2p/wire.py's `Stream`): `send_all(data)`, `receive_some(max_bytes) -> bytes` (b"" at EOF),
`aclose()`. A libp2p stream is the fallback transport of the data channel when a peer's data socket cannot be
reached (relays, NAT): slower (about 0.25x of raw TCP) but always available.
"""

from __future__ import annotations

import logging
import os
from typing import Any

import trio

from p2p.errors import ChannelError

log = logging.getLogger(__name__)

READ_CHUNK = 1024 * 1024
"""Upper bound of one read: an unbounded Yamux `read()` concatenates buffers and collapses to a few MiB/s."""
WRITE_CHUNK = 8 * 1024 * 1024
"""8 MiB writes amortise Yamux's per-write locking (REFERENCE §5)."""
NOISE_SIZED_YAMUX_FRAME = 65_519
"""A Yamux frame (12-byte header included) that fits one Noise message (65,535 bytes minus the 16-byte tag)."""


def tune_yamux() -> None:
    """Apply the measured Yamux tuning once per process.

    - PY_YAMUX_RELEASE_ON_READ=0 (read by py-libp2p at call time): window credit is released in batches, 37x
      fewer window-update frames. Set only if the user has not chosen a value.
    - MAX_MESSAGE_SIZE is a module constant py-libp2p reads on every write; it has no setter, so we assign it:
      frames of 65,519 bytes travel as one Noise message instead of two. It changes only the sender's framing,
      which every Yamux peer accepts.
    """
    os.environ.setdefault("PY_YAMUX_RELEASE_ON_READ", "0")
    from libp2p.stream_muxer.yamux import yamux

    if yamux.MAX_MESSAGE_SIZE > NOISE_SIZED_YAMUX_FRAME:
        yamux.MAX_MESSAGE_SIZE = NOISE_SIZED_YAMUX_FRAME


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
        from libp2p.network.stream.exceptions import StreamEOF

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
