"""Data channels other peers open to this one: their preambles read, each routed to its version's service.

The dialer writes the 32-byte manifest id first (and the signed manifest, when small), so the acceptor routes the
link without guessing. A channel may wait long for its preamble (a warm spare, swarm.policy.spares), so the waits
are bounded per peer and node-wide. A preamble from a peer with the larger id announces a version whose link is this
peer's to dial (swarm.policy.mirror_dial): it is dialed over that same channel.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from typing import Protocol

import trio

from p2p.budget import BudgetExhausted, ByteRate
from p2p.channel.messages import HandshakeBreach
from p2p.pieces.wire import Stream
from swarm.policy.link_preamble import Preamble, read_body, read_head, send_preamble
from swarm.policy.mirror_places import LinkPlaces
from swarm.policy.mirrored import MirroredPolicy
from swarm.policy.spares import DIAL_ERRORS, SpareChannels

log = logging.getLogger("swarm.policy.mirror")
MAX_WAITING_PER_PEER = 4  # inbound data channels of one peer still waiting for their manifest id
MAX_WAITING = 64
"""Inbound data channels waiting for their preamble, over all peers: identities are free, so the per-peer limit
alone bounds nothing. When all are taken, the oldest one that has not started its preamble makes room. With a
preamble's 64 KiB cap (swarm.policy.link_preamble) they hold at most 4 MiB of unverified manifests."""


class Linked(Protocol):
    """Reports a data link of a version opened with `peer` (swarm.policy.mirror.PolicyMirror._linked): `dir` "in"
    or "out", `via` "announcement" when opened over the peer's announcing channel, and for a link this peer dialed,
    the seconds the dial took and whether a spare channel carried it."""

    def __call__(self, policy: MirroredPolicy, peer: str, *, dir: str, via: str | None = None,
                 dial_s: float | None = None, spare: bool | None = None) -> None: ...


class InboundLinks:
    """The channels others open to this peer: each waits for its preamble, then serves the link it names."""

    def __init__(self, my_id: str, policies: dict[bytes, MirroredPolicy], banned: dict[str, str], *,
                 places: LinkPlaces, adopt: Callable[[bytes], MirroredPolicy | None],
                 changed: Callable[[], trio.Event], is_mirrored: Callable[[MirroredPolicy], bool],
                 may_link: Callable[[MirroredPolicy, str], bool], ban: Callable[[str, str], None], linked: Linked,
                 adoption_wait: float, dial_timeout: float, spares: SpareChannels, handshake_timeout: float,
                 preamble_rate: ByteRate) -> None:
        self.my_id = my_id
        self.policies = policies  # the mirror's versions, by manifest id
        self.banned = banned  # peer -> the protocol breach it is never linked for
        self.places = places
        self._adopt = adopt
        self._changed = changed  # the mirror's current wake-up, set when a version is adopted or completes
        self._is_mirrored = is_mirrored
        self._may_link = may_link
        self._ban = ban
        self._linked = linked
        # gossip delivered a manifest up to 21 s after another peer (measured, 5 processes on a loaded machine): an
        # inbound link for a manifest not adopted yet waits this long, and our own links wait as long for a hello
        self.adoption_wait = adoption_wait
        self.dial_timeout = dial_timeout
        self._spares = spares  # a spare's acceptor waits as long as its dialer may keep it unused
        self.handshake_timeout = handshake_timeout
        self.max_links = math.inf  # links per version, as the last reconcile was told
        self._waiting: dict[str, int] = {}
        # inbound channels waiting for a preamble's head, oldest first: the scope that ends the wait of each
        self._idle_waits: dict[int, trio.CancelScope] = {}
        self._preamble_rate = preamble_rate  # bytes of preambles read per second, node-wide

    async def accept_link(self, peer: str, stream: Stream) -> None:
        """Serve an inbound data channel: read the preamble (manifest id + signed manifest), then run the link.

        The preamble may come much later (a warm spare, see `OutboundLinks.reconcile`), so the wait is long but
        bounded, and each peer may keep only a few channels waiting, the node only MAX_WAITING. A manifest we do not
        know yet is adopted from the preamble (it is verified like any other): gossip delivered manifests 5 s late or
        never under load, and the links must not wait for it. A preamble from a peer with the larger id announces a
        version whose link is ours to dial: we dial it over that same channel (`_link_over_announcement`).
        A breach of the preamble format bans the peer; the node-wide preamble read rate, when spent, drops the
        channel only.
        """
        if self._waiting.get(peer, 0) >= MAX_WAITING_PER_PEER or peer in self.banned or not self._room_to_wait():
            return
        self._waiting[peer] = self._waiting.get(peer, 0) + 1
        try:
            preamble = await self.read_preamble(stream)
            if preamble is not None and not preamble.signed and peer < self.my_id:
                # the wait for a manifest gossip has not brought yet (or a version named by id alone, its manifest
                # too large for preambles) counts as waiting too: released after the preamble alone, one peer kept
                # 200 channels open at once, each naming an id nobody knows
                await self._adopted(preamble.route, self.adoption_wait)
        except HandshakeBreach as exc:
            log.warning("banned peer %s: %s", peer, exc)
            self._ban(peer, f"broke the data channel preamble: {exc}")
            return
        except BudgetExhausted as exc:  # counted by the rate; a line each would cost the CPU the rate saves
            log.debug("dropped a data channel of %s: %s", peer, exc)
            return
        finally:
            self._waiting[peer] -= 1
            if not self._waiting[peer]:
                del self._waiting[peer]
        if preamble is not None:
            await self.route(peer, stream, preamble.route, preamble.signed, wait=0.0)

    def _room_to_wait(self) -> bool:
        """Whether one more inbound channel may wait for its preamble: past MAX_WAITING, the oldest channel still
        waiting for its head is ended to make room (a stranger's idle channels cannot lock honest peers out)."""
        if sum(self._waiting.values()) < MAX_WAITING:
            return True
        if not self._idle_waits:
            return False
        oldest = next(iter(self._idle_waits))
        self._idle_waits.pop(oldest).cancel()
        return True

    async def route(self, peer: str, stream: Stream, route: bytes, signed: bytes, wait: float | None = None) -> None:
        """Serve the link a preamble names; from a peer with the larger id it is an announcement, answered below.
        A manifest not adopted yet is waited for `wait` seconds (default: the adoption wait)."""
        if route not in self.policies and signed:
            adopted = self._adopt(signed)
            if adopted is None or adopted.manifest.id != route:
                return
        if peer > self.my_id:
            await self._link_over_announcement(peer, stream, route)
            return
        policy = await self._adopted(route, self.adoption_wait if wait is None else wait)
        if not (policy and policy.service and self._may_link(policy, peer) and self.places.admit(policy, peer)):
            return  # unknown manifest, not shared with `peer`, or no place for it: the dialer links elsewhere
        self._linked(policy, peer, dir="in")
        await policy.service.serve_link(peer, stream)

    async def _link_over_announcement(self, peer: str, stream: Stream, route: bytes) -> None:
        """Dial the announced version's link over the announcing channel itself: write our preamble back on it.

        Why: the link of this pair is ours to dial, and the channel is already open. Dialing anew took one of our
        spares, then a fresh dial to replace it: 119 of the 308 data channels a 6-step `swarm sim` opened. If we
        already have or are dialing that link, or want no more links, we just return (the caller closes it).
        """
        policy = self.policies.get(route)
        if (policy is None or policy.service is None or not self._is_mirrored(policy)
                or not self._may_link(policy, peer) or peer in policy.service.peers or peer in policy.dialing
                or len(policy.service.peers) >= self.max_links or not self.places.admit(policy, peer)):
            return
        policy.dialing.add(peer)
        try:
            with trio.fail_after(self.dial_timeout):
                await send_preamble(stream, policy.manifest.id, b"")  # the announcer holds the manifest it named
        except DIAL_ERRORS as exc:
            policy.failures[peer] = trio.current_time()
            log.debug("answering an announcement of %s failed: %s", peer, exc)
            return
        finally:
            policy.dialing.discard(peer)
        # serve_link registers the link before it first waits, so reconcile never sees this pair unlinked and idle;
        # the announcer opened it, not we: answered announcements must not fill the places we choose ourselves
        self._linked(policy, peer, dir="out", via="announcement")
        await policy.service.serve_link(peer, stream)

    async def read_preamble(self, stream: Stream, wait: float | None = None) -> Preamble | None:
        """The preamble of a data channel, None if it ends or stalls first (or another channel needed its place
        while it had not started); a manifest we hold is not buffered (swarm.policy.link_preamble).

        By default we wait as long as a dialer may keep a spare channel before using it."""
        wait = self._spares.ttl + self.handshake_timeout if wait is None else wait
        with trio.CancelScope() as idle:
            self._idle_waits[id(idle)] = idle
            try:
                head = await read_head(stream, wait)
            finally:
                self._idle_waits.pop(id(idle), None)
        if idle.cancelled_caught or head is None:
            return None
        return await read_body(stream, head, self.handshake_timeout, lambda route: route in self.policies,
                               self._preamble_rate)

    async def _adopted(self, manifest_id: bytes, wait: float) -> MirroredPolicy | None:
        with trio.move_on_after(wait):
            while manifest_id not in self.policies:
                await self._changed().wait()
        return self.policies.get(manifest_id)
