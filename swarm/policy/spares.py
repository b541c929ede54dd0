"""Spare data channels: one open channel kept ahead of need to each peer this peer dials, renewed as it ages.

Why: opening a data channel costs a few libp2p round trips, measured at 2.5-4.6 s per dial on a loaded machine with
several peers starting, longer than the whole transfer of a small policy; a new version's link takes the spare and
only writes its manifest id (swarm.policy.mirror_dial.OutboundLinks.reconcile).
"""

from __future__ import annotations

import logging
import math
import random
from collections.abc import Awaitable, Callable

import trio

from p2p.channel.messages import HandshakeBreach
from p2p.errors import P2PError
from p2p.pieces.wire import Stream
from swarm.event_types import Event, Spare

log = logging.getLogger("swarm.policy.mirror")
SPARE_RETRY = 2.0
"""Seconds before a failed spare dial to a peer is tried again; doubled after each failure in a row."""
SPARE_RETRY_MAX = 30.0
"""The longest pause between spare dials to a peer that keeps failing them (links still dial every 2 s)."""
SPARE_TTL = 600.0
"""Seconds a spare data channel is kept unused at most (`spare_ttl`), and the acceptor waits for its preamble.
Why 10 minutes: renewing each neighbour's spare every 3-4 minutes was a channel opened and one accepted about every
5 s on a peer of 44 connections, between versions; an idle spare holds only a socket, which TCP keepalive (every 30 s
on data sockets) keeps in NAT tables, and one that died meanwhile fails when used and is dialed anew."""
SPARE_ABSENT_GRACE = 60.0
"""Seconds a spare outlives its peer's connection; past it the spare is closed and its place among `max_links`
freed. Why a grace: closing a spare at the first connection listing without its peer left pairs cold (listings
miss a peer while its connection is replaced); why at all: a spare to a neighbour that left would hold its place
for up to SPARE_TTL, and the neighbours that remain would go without."""
MAX_FAILURES = 4096
"""Peers whose spare dials are backed off, remembered at most (the oldest failure is forgotten first): each refusing
identity of a crowd would otherwise stay in memory for the life of the process."""
SPARE_TTL_SPREAD = 0.25
"""Spares live between 75 % and 100 % of `spare_ttl` (`spare_lifetime`)."""
DIAL_ERRORS = (P2PError, trio.BrokenResourceError, trio.ClosedResourceError, trio.TooSlowError, OSError)
"""What a dial, or a preamble written on a channel, may fail with in the ordinary course."""
Dialer = Callable[[str], Awaitable[Stream]]
"""Opens a new data channel to a peer."""
StartWith = Callable[..., None]
"""Starts `task(*args)` with one peer in the mirror's nursery, contained (swarm.policy.mirror.PolicyMirror)."""


class SpareChannels:
    """This peer's spare data channels: one per peer it dials, taken by a link, renewed when it ages or fails."""

    def __init__(self, my_id: str, *, ttl: float, dial_timeout: float, on_event: Callable[[Event], None],
                 close: Callable[[Stream], None], start_with: StartWith) -> None:
        self.my_id = my_id
        self.ttl = ttl  # a spare data channel is closed and dialed anew within this (spare_lifetime)
        self.dial_timeout = dial_timeout
        self.on_event = on_event
        self._close = close  # closes a channel in the mirror's nursery
        self._start_with = start_with
        self._spares: dict[str, tuple[Stream, float]] = {}  # peer -> (open data channel, no manifest yet; retire at)
        self._dialing: set[str] = set()
        self._failures: dict[str, tuple[float, float]] = {}  # peer -> (retry at, pause)
        self._absent: dict[str, float] = {}  # peer holding a spare -> since when it is not connected

    def peers(self) -> set[str]:
        """Peers we hold a spare channel with, or are dialing one to."""
        return set(self._spares) | self._dialing

    def dialing(self, peer: str) -> bool:
        """Whether a spare to `peer` is being dialed (a link dial would only compete with it)."""
        return peer in self._dialing

    def pop(self, peer: str) -> tuple[Stream, float] | None:
        """Remove our spare to `peer` (the channel and when it retires), with its peer's absence, if any."""
        self._absent.pop(peer, None)
        return self._spares.pop(peer, None)

    def close(self, peer: str) -> None:
        """Close our spare channel to `peer`, if any (it is banned)."""
        spare = self.pop(peer)
        if spare is not None:
            self._close(spare[0])

    def take(self, peer: str, now: float) -> Stream | None:
        """Our spare to `peer` for a link, None without one or when it is too old to be used."""
        spare = self.pop(peer)
        if spare is None:
            return None
        if now > spare[1]:  # the acceptor stops waiting for it soon: close it cleanly, not by GC
            self._close(spare[0])
            return None
        return spare[0]

    def keep(self, peers: list[str], dial: Dialer, max_links: int, now: float) -> None:
        """Retire aged spares and those of peers gone past SPARE_ABSENT_GRACE, and dial one to each of `peers`
        without one, up to `max_links` in all, except to peers whose spare dials back off."""
        present = set(peers)
        for peer, (stream, retire_at) in list(self._spares.items()):
            # age retires a spare (the acceptor stops waiting soon after), and so does its peer's absence past
            # SPARE_ABSENT_GRACE; a spare that died meanwhile fails when used and is dialed anew
            if peer in present:
                self._absent.pop(peer, None)
                gone_for = 0.0
            else:
                gone_for = now - self._absent.setdefault(peer, now)
            if now > retire_at or gone_for > SPARE_ABSENT_GRACE:
                self.pop(peer)
                self._close(stream)
        for peer in peers:
            if (peer == self.my_id or peer in self._spares or peer in self._dialing
                    or len(self._spares) + len(self._dialing) >= max_links
                    or now < self._failures.get(peer, (-math.inf, 0.0))[0]):
                continue
            self._dialing.add(peer)
            self._start_with(peer, self._dial, peer, dial)

    def failed(self, peer: str) -> None:
        """Back off spare dials to `peer`, doubling the pause from SPARE_RETRY up to SPARE_RETRY_MAX.

        Why: each spare dial to a peer that never accepts a data channel (a stranger without the protocol, or one
        refusing us) costs a libp2p stream and a protocol negotiation; at one every 2 s, sixteen such identities
        took about an eighth of the CPU a target spent under attack. A success resets the pause."""
        delay = min(SPARE_RETRY_MAX, 2 * self._failures.pop(peer, (0.0, SPARE_RETRY / 2))[1])
        if len(self._failures) >= MAX_FAILURES:  # identities are free: forget the longest-known failure first
            self._failures.pop(next(iter(self._failures)))
        self._failures[peer] = (trio.current_time() + delay, delay)

    async def _dial(self, peer: str, dial: Dialer) -> None:
        try:
            with trio.fail_after(self.dial_timeout):
                stream = await dial(peer)
            self._spares[peer] = (stream, trio.current_time() + spare_lifetime(self.ttl))
            self._failures.pop(peer, None)
            self.on_event(Spare(peer=peer))
        except DIAL_ERRORS as exc:
            raise_breach(exc)
            self.failed(peer)
            log.debug("spare data channel to %s failed: %s", peer, exc)
        finally:
            self._dialing.discard(peer)


def spare_lifetime(ttl: float, draw: Callable[[], float] = random.random) -> float:
    """How long one spare channel is kept: `ttl` less up to SPARE_TTL_SPREAD of it, drawn per spare. Why drawn: the
    spares of peers that joined together were renewed together, every `ttl`, in a burst of a dial per neighbour on
    every peer at once; never more than `ttl`, which the acceptor waits for a preamble
    (swarm.policy.inbound_links.InboundLinks.read_preamble)."""
    return ttl * (1.0 - SPARE_TTL_SPREAD * draw())


def raise_breach(exc: BaseException) -> None:
    """A failed dial is routine unless the peer broke the handshake: that one goes on up, to ban the peer."""
    if isinstance(exc, HandshakeBreach):
        raise exc
