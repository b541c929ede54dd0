"""Guarded stream handlers and the stream helpers every protocol shares.

Why a guard around every handler: py-libp2p runs handlers in the connection's nursery, so an exception escaping
one kills the host and the trio run around it. The guard keeps each fault where it happens: the stream is reset,
one line is logged, and the peer that opened it is penalised through `on_fault`
(p2p.host.p2p_host.P2PHost.handler_fault).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Awaitable, Callable

import trio
from libp2p.abc import INetStream
from libp2p.network.stream.exceptions import StreamError
from libp2p.stream_muxer.exceptions import MuxedConnError, MuxedStreamError

from p2p.errors import StreamEndedEarly

log = logging.getLogger("p2p.host")  # one logger for the host and its handlers: operators filter on it

StreamHandler = Callable[[INetStream], Awaitable[None]]


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__


def _stream_peer(stream: INetStream) -> str | None:
    """The peer id at the other end of a libp2p stream, None for a stream that names none."""
    try:
        return str(stream.muxed_conn.peer_id)
    except Exception:  # noqa: BLE001 - a stream of another kind (tests, memnet) has no muxed connection
        return None


def guard_handler(protocol: str, handler: StreamHandler, timeout: float | None, *, idle_streams: bool = False,
                  admit: Callable[[INetStream], bool] | None = None,
                  on_fault: Callable[[INetStream, str], None] | None = None) -> StreamHandler:
    """Wrap a stream handler: a raise or a run past `timeout` resets the stream and is logged in one line (at
    debug level for a protocol with `idle_streams`, see P2PHost.set_guarded_handler). `admit(stream)` false:
    the stream is reset unserved. `on_fault(stream, protocol)`: called for an unexpected exception (not for a peer
    that merely went away), to penalise the peer."""

    async def guarded(stream: INetStream) -> None:
        if admit is not None and not admit(stream):
            await reset_quietly(stream)
            return
        # Our limit is a cancel scope, so that it is told apart from a TooSlowError of the handler's own deadline.
        limit = trio.CancelScope(deadline=trio.current_time() + timeout if timeout is not None else math.inf)
        try:
            with limit:
                await handler(stream)
        except trio.TooSlowError:
            log.warning("handler for %s exceeded its own deadline; stream reset", protocol)
            await reset_quietly(stream)
        except Exception as exc:  # noqa: BLE001 - the whole point: nothing escapes into libp2p's nursery
            went_away = peer_went_away(exc)
            log.log(logging.DEBUG if went_away else logging.WARNING, "handler for %s failed (%s); stream reset",
                    protocol, _one_line(exc))
            log.debug("handler traceback", exc_info=True)
            if not went_away and on_fault is not None:
                _penalise(on_fault, stream, protocol)
            await reset_quietly(stream)
        if limit.cancelled_caught:
            log.log(logging.DEBUG if idle_streams else logging.WARNING, "handler for %s exceeded %g s; stream reset",
                    protocol, timeout)
            await reset_quietly(stream)

    return guarded


def _penalise(on_fault: Callable[[INetStream, str], None], stream: INetStream, protocol: str) -> None:
    """Run the penalty hook; its own failure (a listener's bug, a host shutting down) is logged, never raised into
    py-libp2p's nursery."""
    try:
        on_fault(stream, protocol)
    except Exception as exc:  # noqa: BLE001 - same rule as the handler itself
        log.warning("penalising the peer of a failed %s stream failed (%s)", protocol, _one_line(exc))


async def reset_quietly(stream: INetStream) -> None:
    """Reset a libp2p stream, ignoring errors (the stream may already be gone) and bounded in time."""
    with trio.move_on_after(1.0) as scope:
        scope.shield = True
        try:
            await stream.reset()
        except Exception:  # noqa: BLE001 - best effort on an already broken stream
            log.debug("stream reset failed", exc_info=True)


def peer_went_away(exc: BaseException) -> bool:
    """Whether `exc` only says that the other end closed, reset or dropped the stream: routine on a network (a
    requester that gave up, a peer that left), so no warning, unlike a failure of the handler itself."""
    return isinstance(exc, (StreamError, MuxedStreamError, MuxedConnError, StreamEndedEarly, EOFError,
                            ConnectionError, trio.BrokenResourceError, trio.ClosedResourceError))


async def read_exactly(stream: INetStream, n: int, what: str = "stream") -> bytes:
    """Exactly `n` bytes from a libp2p stream, read in chunks of at most 1 MiB; HostError if the peer closes early.

    Why bounded chunks: one unbounded Yamux read of a large message collapses throughput
    (docs/reference.md#py-libp2p-pitfalls).
    """
    buf = bytearray()
    while len(buf) < n:
        try:
            chunk = await stream.read(min(n - len(buf), 1 << 20))
        except Exception as exc:  # py-libp2p ends a closed or reset stream with its own exceptions (StreamEOF, ...)
            if not peer_went_away(exc):
                raise
            raise StreamEndedEarly(f"the peer closed the {what} early ({type(exc).__name__})") from exc
        if not chunk:
            raise StreamEndedEarly(f"the peer closed the {what} early")
        buf += chunk
    return bytes(buf)
