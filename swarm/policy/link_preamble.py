"""What a data channel of the policy mirror starts with: a preamble naming the manifest its link is for.

    | manifest id (32 bytes) | u32 length of the signed manifest | signed manifest (may be empty) |

The dialer sends the signed manifest along, when it is small (PREAMBLE_INLINE_MAX), so an acceptor that gossip has
not reached yet can adopt it (it is verified like any other). Rules here: the 36-byte head is decoded into a typed
value, and the declared length is checked, before a byte of the manifest is read; the manifest's bytes are held only
under a lease on the node's budget of unverified input (p2p/budget.py), so stalled preambles of any number of
identities hold at most that budget; and a manifest the acceptor already holds is read and dropped as it comes,
never buffered, so a full budget costs honest peers nothing for the versions everyone has.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import trio

from p2p.budget import BudgetLease, ByteRate, MemoryBudget
from p2p.channel_messages import HandshakeBreach
from p2p.errors import P2PError
from p2p.manifest import MAX_MANIFEST_BYTES

log = logging.getLogger(__name__)
ROUTE_BYTES = 32
HEAD_BYTES = ROUTE_BYTES + 4
MAX_SIGNED_BYTES = MAX_MANIFEST_BYTES + 1024
"""The largest signed manifest a preamble may carry (p2p.manifest's limit plus its signature and framing)."""
_CHUNK = 1 << 20
PREAMBLE_INLINE_MAX = 64 * 1024
"""Largest signed manifest a preamble carries; a larger one is named by its id alone (`inline_manifest`)."""
PREAMBLE_BUDGET = MemoryBudget(32 << 20)
"""Manifests of preambles for versions this peer does not hold yet, over every channel: their own budget, so
strangers filling it cost honest links (whose manifests we hold, or whose pieces use p2p.budget.NODE_BUDGET)
nothing. 32 MiB: the largest valid manifest, or a dozen of a 62 GB policy's 2.1 MB."""
PREAMBLE_RATE = ByteRate(rate=8 << 20, burst=MAX_SIGNED_BYTES, max_wait=2.0)
"""Bytes of preamble manifests read per second, over every channel, whether kept or dropped as they come (each is
decrypted either way): 8 MiB/s costs a few percent of a core, the burst lets the largest manifest through at once
when no stranger is spending it, and past 2 s of queue a channel is dropped before its bytes are read."""
_ENDED = (P2PError, trio.BrokenResourceError, trio.ClosedResourceError)


class PreambleBreach(HandshakeBreach):
    """A preamble declared a manifest larger than any valid one: the peer breaks the protocol."""


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
    """The 36-byte head as a typed value; PreambleBreach when it declares more than a manifest can be."""
    if len(raw) != HEAD_BYTES:
        raise PreambleBreach(f"a preamble head is {HEAD_BYTES} bytes, got {len(raw)}")
    size = int.from_bytes(raw[ROUTE_BYTES:], "big")
    if size > MAX_SIGNED_BYTES:
        raise PreambleBreach(f"a preamble declared a manifest of {size} bytes (at most {MAX_SIGNED_BYTES})")
    return PreambleHead(bytes(raw[:ROUTE_BYTES]), size)


def inline_manifest(signed: bytes) -> bytes:
    """What a dialer's preamble carries of a version's signed manifest: all of it when small, else nothing.

    Why: every link of every version starts with a preamble, and a 62 GB policy's manifest is 2.1 MB, so at 13
    links per version a peer would move and decrypt 27 MB per version (0.45 MB/s at one version a minute), over
    the 100 kB/s a peer's protocol may cost, for a manifest that gossip brings every peer anyway: a large one is
    announced by id and fetched once per peer (swarm.node.gossip). An acceptor that lacks it waits for that, as it
    waits for a version only named."""
    return signed if len(signed) <= PREAMBLE_INLINE_MAX else b""


async def send_preamble(stream: Any, manifest_id: bytes, signed: bytes) -> None:
    """What a data channel starts with: the manifest id, then the signed manifest (u32 length + bytes)."""
    await stream.send_all(manifest_id + len(signed).to_bytes(4, "big") + signed)


async def read_head(stream: Any, timeout: float) -> PreambleHead | None:
    """The head, or None if the channel ends, breaks or stalls first (a dialer may drop a spare at any time)."""
    raw = await _read_into(stream, HEAD_BYTES, timeout, None)
    return None if raw is None else decode_head(raw)


async def read_body(stream: Any, head: PreambleHead, timeout: float, budget: MemoryBudget,
                    known: Callable[[bytes], bool], rate: ByteRate = PREAMBLE_RATE) -> Preamble | None:
    """The manifest bytes the head declared, held under a lease on `budget` while they arrive and read no faster
    than `rate` allows (BudgetExhausted when the node holds too much already, or reads too much); dropped as they
    come when `known(route)`. None if the channel ends or stalls first."""
    if not head.signed_size:
        return Preamble(head.route, b"")
    if known(head.route):
        drained = await _read_into(stream, head.signed_size, timeout, None, keep=False, rate=rate)
        return None if drained is None else Preamble(head.route, b"")
    with budget.lease("a preamble's manifest") as lease:
        signed = await _read_into(stream, head.signed_size, timeout, lease, rate=rate)
    return None if signed is None else Preamble(head.route, signed)


async def _read_into(stream: Any, size: int, timeout: float, lease: BudgetLease | None,
                     keep: bool = True, rate: ByteRate | None = None) -> bytes | None:
    """`size` bytes (or, without `keep`, that many read and dropped), charging `lease` before keeping each chunk
    and reserving each chunk on `rate` before reading it.

    Chunks are kept as they came and joined once at the end (one buffer grown in place is copied as it grows)."""
    chunks: list[bytes | bytearray] = []
    got = 0
    try:
        with trio.move_on_after(timeout):
            while got < size:
                chunk = await _receive(stream, min(size - got, _CHUNK), rate)
                if not chunk:
                    return None
                got += len(chunk)
                if keep:
                    if lease is not None:
                        lease.resize(got)
                    chunks.append(chunk)
            return b"".join(chunks)
        return None
    finally:  # an error's traceback keeps this frame alive until a full garbage collection: not its chunks
        chunks.clear()


async def _receive(stream: Any, want: int, rate: ByteRate | None) -> bytes | bytearray:
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
