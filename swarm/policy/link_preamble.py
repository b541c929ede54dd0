"""What a data channel of the policy mirror starts with: a preamble naming the manifest its link is for.

    | manifest id (32 bytes) | u32 length of the signed manifest | signed manifest (may be empty) |

The dialer sends the signed manifest along when it is small (at most PREAMBLE_INLINE_MAX), so an acceptor that
gossip has not reached yet can adopt it (it is verified like any other); a larger one is named by its id alone.
Rules here: the 36-byte head is decoded into a typed value, and a declared length over PREAMBLE_INLINE_MAX is a
breach, before a byte of the manifest is read; so a channel holds at most 64 KiB of unverified preamble, and the
mirror's cap on channels waiting for theirs (swarm.policy.inbound_links.MAX_WAITING) bounds them all, however many
identities stall them. A manifest the acceptor already holds is read and dropped as it comes, never buffered, and
every preamble byte, kept or dropped, is read no faster than one node-wide rate.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

import trio

from p2p.budget import ByteRate
from p2p.channel.messages import HandshakeBreach
from p2p.errors import P2PError
from p2p.pieces.wire import Stream

log = logging.getLogger(__name__)
ROUTE_BYTES = 32
HEAD_BYTES = ROUTE_BYTES + 4
PREAMBLE_INLINE_MAX = 64 * 1024
"""Largest signed manifest a preamble carries; a larger one is named by its id alone (`inline_manifest`), and a
preamble declaring more is a breach."""
PREAMBLE_RATE = ByteRate(rate=8 << 20, burst=64 * PREAMBLE_INLINE_MAX, max_wait=2.0)
"""Bytes of preamble manifests read per second, over every channel, whether kept or dropped as they come (each is
decrypted either way): 8 MiB/s costs a few percent of a core, the burst lets the preambles of as many channels as
may wait at once (swarm.policy.inbound_links.MAX_WAITING) through when no stranger is spending it, and past 2 s of
queue a channel is dropped before its bytes are read."""
_ENDED = (P2PError, trio.BrokenResourceError, trio.ClosedResourceError)


class PreambleBreach(HandshakeBreach):
    """A preamble declared a manifest larger than a preamble carries: the peer breaks the protocol."""


@dataclass(frozen=True)
class PreambleHead:
    """The preamble's fixed part: which manifest's link this is, and how many manifest bytes follow."""

    route: bytes
    signed_size: int


@dataclass(frozen=True)
class Preamble:
    """A whole preamble; `signed` is empty when the dialer sent none or the acceptor already holds the manifest."""

    route: bytes
    signed: bytes


def decode_head(raw: bytes) -> PreambleHead:
    """The 36-byte head as a typed value; PreambleBreach when it declares more than a preamble carries."""
    if len(raw) != HEAD_BYTES:
        raise PreambleBreach(f"a preamble head is {HEAD_BYTES} bytes, got {len(raw)}")
    size = int.from_bytes(raw[ROUTE_BYTES:], "big")
    if size > PREAMBLE_INLINE_MAX:
        raise PreambleBreach(f"a preamble declared a manifest of {size} bytes; a preamble carries at most "
                             f"{PREAMBLE_INLINE_MAX} (a larger manifest is named by its id alone)")
    return PreambleHead(bytes(raw[:ROUTE_BYTES]), size)


def inline_manifest(signed: bytes) -> bytes:
    """What a dialer's preamble carries of a version's signed manifest: all of it when small, else nothing.

    Why: every link of every version starts with a preamble, and a 62 GB policy's manifest is 2.1 MB, so at 13
    links per version a peer would move and decrypt 27 MB per version (0.45 MB/s at one version a minute), over
    the 100 kB/s a peer's protocol may cost, for a manifest that gossip brings every peer anyway: a large one is
    announced by id and fetched once per peer (swarm.node.gossip). An acceptor that lacks it waits for that, as it
    waits for a version only named."""
    return signed if len(signed) <= PREAMBLE_INLINE_MAX else b""


async def send_preamble(stream: Stream, manifest_id: bytes, signed: bytes) -> None:
    """What a data channel starts with: the manifest id, then the signed manifest (u32 length + bytes)."""
    await stream.send_all(manifest_id + len(signed).to_bytes(4, "big") + signed)


async def read_head(stream: Stream, timeout: float) -> PreambleHead | None:
    """The head, or None if the channel ends, breaks or stalls first (a dialer may drop a spare at any time)."""
    raw = await _read_into(stream, HEAD_BYTES, timeout)
    return None if raw is None else decode_head(raw)


async def read_body(stream: Stream, head: PreambleHead, timeout: float, known: Callable[[bytes], bool],
                    rate: ByteRate = PREAMBLE_RATE) -> Preamble | None:
    """The manifest bytes the head declared (at most PREAMBLE_INLINE_MAX), read no faster than `rate` allows
    (BudgetExhausted when the node reads too much already) and dropped as they come when `known(route)`. None if
    the channel ends or stalls first."""
    if not head.signed_size:
        return Preamble(head.route, b"")
    held = known(head.route)
    signed = await _read_into(stream, head.signed_size, timeout, keep=not held, rate=rate)
    return None if signed is None else Preamble(head.route, b"" if held else signed)


async def _read_into(stream: Stream, size: int, timeout: float, keep: bool = True,
                     rate: ByteRate | None = None) -> bytes | None:
    """`size` bytes (or, without `keep`, that many read and dropped), each chunk reserved on `rate` before it is
    read. Chunks are kept as they came and joined once at the end."""
    chunks: list[bytes | bytearray] = []
    got = 0
    try:
        with trio.move_on_after(timeout):
            while got < size:
                chunk = await _receive(stream, size - got, rate)
                if not chunk:
                    return None
                got += len(chunk)
                if keep:
                    chunks.append(chunk)
            return b"".join(chunks)
        return None
    finally:  # an error's traceback keeps this frame alive until a full garbage collection: not its chunks
        chunks.clear()


async def _receive(stream: Stream, want: int, rate: ByteRate | None) -> bytes | bytearray:
    """At most `want` bytes, empty when the channel ends; reserved on `rate` (if any) before they are read, what
    did not come given back."""
    if rate is not None:
        wait = rate.reserve(want, "a data channel's preamble", trio.current_time())
        if wait:
            await trio.sleep(wait)
    chunk: bytes | bytearray = b""
    try:
        chunk = await stream.receive_some(want)
    except _ENDED as exc:
        log.debug("data channel ended inside its preamble: %s", exc)
    finally:
        if rate is not None and len(chunk) < want:
            rate.give_back(want - len(chunk), trio.current_time())
    return chunk
