"""Data channel tickets: one-time tokens handed out with an offer, each good for one more channel to the same listener
without another libp2p handshake.

Why: a data channel costs a libp2p stream, a protocol negotiation and an offer on both ends before its socket even
connects, about two thirds of the CPU the channel costs (p2p.channel.service) and two round trips on a real network. A
peer opens one to each neighbour it links per version and one more to replace the spare it used (swarm.policy), so in a
run publishing a version every 20 s most of what a version costs a peer in protocol is that. With tickets, the next
channels to the same listener are a TCP connect and a token.

Why they stay as safe as the first channel:
- a ticket travels inside the Noise-encrypted offer to the authenticated peer only, is single-use, and expires;
- its channel's secret is derived from the offer's secret and the ticket itself, so every channel has its own
  record key (record nonces restart per channel) and a token seen on the wire gives nobody the key;
- the listener admits a ticket only while its peer is connected over libp2p and not banned, so a peer banned or
  gone since the offer cannot come back through a ticket;
- a ticket's channel spends the listener's handshake rate like the handshake it saves, so channels open no faster
  than before;
- the listener caps tickets per peer (its oldest replaced, never a reason to refuse an offer: tickets a dialer lost
  track of must not lock it out) and over all peers; one it dropped (a cap, a restart) costs the dialer a refused
  connect, after which it opens the channel with a handshake and is not marked unreachable.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

import blake3

_TICKET_CONTEXT = "rl-swarm 2026 data channel v1 ticket secret"
MAX_PAIRS = 4096
"""(our peer, their peer) pairs a book holds tickets for; past it the longest unused pair goes."""
EXPIRY_MARGIN_S = 5.0
"""A ticket this close to its expiry is not used: the connect and token might arrive after the listener drops it."""


def ticket_secret(offer_secret: bytes, token: bytes) -> bytes:
    """The secret of the channel a ticket opens: bound to the offer's secret and to the ticket."""
    return blake3.blake3(offer_secret + token, derive_key_context=_TICKET_CONTEXT).digest(length=len(offer_secret))


@dataclass(frozen=True)
class Ticket:
    """What a dialer needs to open one channel with a ticket: where, the token, the channel's secret and cipher."""

    ip: str
    port: int
    token: bytes
    secret: bytes
    aead: str
    expires: float
    """Trio time after which the listener no longer admits the token."""


class TicketBook:
    """Tickets a process holds, per (our peer id, their peer id): one process may run many peers (`swarm sim`).

    A pure table: callers pass the time. Bounded in pairs (MAX_PAIRS) and in tickets per pair (what offers carry)."""

    def __init__(self, max_pairs: int = MAX_PAIRS) -> None:
        self.max_pairs = max_pairs
        self._tickets: OrderedDict[tuple[str, str], list[Ticket]] = OrderedDict()

    def add(self, me: str, peer: str, tickets: list[Ticket], per_pair: int) -> None:
        """Keep `tickets` for channels from `me` to `peer`, at most `per_pair` of them (the newest)."""
        if not tickets:
            return
        key = (me, peer)
        held = self._tickets.pop(key, [])
        self._tickets[key] = (held + tickets)[-per_pair:]
        while len(self._tickets) > self.max_pairs:
            self._tickets.popitem(last=False)

    def take(self, me: str, peer: str, now: float) -> Ticket | None:
        """A ticket for a channel from `me` to `peer` that is still good at `now`, removed from the book."""
        key = (me, peer)
        held = [t for t in self._tickets.pop(key, []) if t.expires - EXPIRY_MARGIN_S > now]
        if not held:
            return None
        ticket = held.pop(0)  # the oldest first: it expires first
        if held:
            self._tickets[key] = held
        return ticket

    def forget(self, me: str, peer: str) -> None:
        """Drop every ticket from `me` to `peer` (one was refused: the listener restarted or dropped them)."""
        self._tickets.pop((me, peer), None)

    def held(self, me: str, peer: str) -> int:
        """How many tickets from `me` to `peer` are held (expired ones included until the next `take`)."""
        return len(self._tickets.get((me, peer), ()))
