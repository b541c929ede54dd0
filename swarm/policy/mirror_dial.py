"""The policy mirror's outbound links: spare channels kept warm, links dialed, versions announced.

A mixin of swarm.policy.mirror.PolicyMirror (its state lives there: policies, spares, failures, the nursery); see that
module's docstring for the link rules. Every task started here runs inside `_contained`, so nothing a peer sends
(a malformed offer, a broken preamble) and no bug in handling it can end the mirror's nursery, and with it the node.
"""

from __future__ import annotations

import logging
import math
import random
from collections.abc import Awaitable, Callable
from typing import Any

import blake3
import trio

from p2p.channel.messages import HandshakeBreach
from p2p.errors import P2PError
from swarm.event_types import Spare
from swarm.policy.link_places import choose_order
from swarm.policy.link_preamble import inline_manifest, send_preamble
from swarm.policy.mirrored import MirroredPolicy

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
SPARE_TTL_SPREAD = 0.25
"""Spares live between 75 % and 100 % of `spare_ttl` (`spare_lifetime`)."""
TOP_UP_AFTER = 5.0
"""Seconds after adopting a version during which a peer opens only its own half of `links_per_version`; after, it
tops up to all of them if the links others opened to it meanwhile fall short. Why: every peer of a run adopts a
version within about a second and opened all its places at once, before the links others chose to open to it had
arrived, so each held about twice `links_per_version` (15.7 link ends per version at 64 peers with 8 meant), and a
version cost each peer twice the links a broadcast needs (8 per peer stays within 1.3x of the bound in virtual time
at 1,000 peers). Half its own at once still gives each peer links of its own choosing from the start. 5 s covers
a version's flood and a late peer's announcement (`announce_after`), with room for a loaded machine; a peer short
of links waits that long with its own half, which a broadcast of a large policy does not notice."""
RECONCILE_BUSY_S = 0.25
"""Seconds between link rounds (`reconcile`) while this peer fetches a version or signed one: its links open, top
up and replace the ones that stall within a quarter second."""
RECONCILE_IDLE_S = 2.0
"""Seconds between link rounds once every version is complete here and signed by another peer: the rounds then
only renew spares, dial new neighbours and repeat announcements to smaller ones, which a second's delay does not
hurt, and the node wakes a round at once when a version is adopted or completes (its own half of the links opens
then). Why not a quarter second always: a round lists the connections and walks every spare and version, about
0.2-0.3 ms of CPU, and four of them a second were the largest single cost of an idle peer of 32 (a tenth of a
percent of a core, more than py-libp2p's gossip heartbeat). Why not for a version's first 30 s as well: with a
version every 20 s that kept every peer at four rounds a second for good, a third of what a version cost a peer
of 32 (a per-task CPU count), while a peer holding every piece opens no top-ups and needs no stalled link
replaced (the neighbours still fetching replace their own)."""
ANNOUNCE_AGAIN_AFTER = 10.0
"""Seconds before a smaller peer is told of a version again, while this peer still opens links for it: the first
announcement may have found it without the version or full, its answer may have failed, or the link it dialed may
have dropped since. Why not once only: a peer holding a version it did not sign opens no top-ups, so a peer still
fetching reaches its smaller neighbours through its own announcements alone; why not at every round: each
announcement takes a spare channel, and a neighbour that keeps refusing would cost a spare every round."""
_DIAL_ERRORS = (P2PError, trio.BrokenResourceError, trio.ClosedResourceError, trio.TooSlowError, OSError)
Dialer = Callable[[str], Awaitable[Any]]


class OutboundLinks:
    """Dialing side of PolicyMirror: `reconcile` opens what this peer should dial."""

    async def _contained(self, peer: str, task: Callable[..., Awaitable[None]], *args: Any) -> None:
        """Run one of the mirror's tasks with `peer`: whatever it raises costs that peer (a handshake breach bans
        it, anything else backs its dials off), never the mirror's nursery, whose end would stop the node (a peer
        answering an offer with a field of the wrong type could otherwise stop every node it connects to)."""
        try:
            await task(*args)
        except HandshakeBreach as exc:
            log.warning("banned peer %s: %s", peer, exc)
            self._ban(peer, f"broke the data channel handshake: {exc}")
        except Exception as exc:  # noqa: BLE001 - one peer's input or our bug with it: that peer's task ends
            self._spare_failed(peer)
            log.warning("data channel task with %s failed: %s: %s", peer, type(exc).__name__, exc)
            log.debug("data channel task traceback", exc_info=True)

    async def reconcile(self, peers: list[str], dial: Dialer, max_links: int) -> None:
        """Open the links this peer should dial: smaller peer id dials, failed dials back off.

        Why spares: opening a data channel costs a few libp2p round trips, measured at 2.5-4.6 s per dial on a
        loaded machine with several peers starting, longer than the whole transfer of a small policy. So every
        peer we dial keeps one channel open ahead of need, and a new version's link takes it and only writes its
        manifest id.
        """
        now = trio.current_time()
        self._max_links = max_links
        peers = [peer for peer in peers if peer not in self.banned]
        wanted = min(max_links, self.links_per_version)
        for policy in list(self.policies.values()):
            service = policy.service
            if service is None or service._nursery is None:
                continue
            self._tend_places(policy, now)  # idle links give their places up first
            own_half_only = now - policy.adopted_at < self.top_up_after or self._holds_as_follower(policy)
            if _enough_links(policy, wanted, own_half_only):
                continue  # most rounds: nothing to open, so no order to draw (every round, every version)
            drawn = link_order(policy.manifest.id, self.link_salt, peers, last=policy.dropped | policy.released)
            trusted = self.trusted_for(policy)
            for peer in choose_order(drawn, trusted, (wanted + 1) // 2, policy.dropped, policy.released,
                                     self.trust_rank(policy)):
                if _enough_links(policy, wanted, own_half_only):
                    break
                if (peer == self.my_id or peer in service.peers or peer in policy.dialing
                        or peer in self._spare_dialing  # about to be there: a second dial would only compete
                        or not self._may_link(policy, peer) or now - policy.failures.get(peer, -math.inf) < 2.0):
                    continue
                if peer < self.my_id:  # its link is the peer's to dial: tell it about the manifest if it is late
                    late = (now - policy.announced.get(peer, -math.inf) >= ANNOUNCE_AGAIN_AFTER
                            and now - policy.adopted_at >= self.announce_after)
                    spare = self._take_spare(peer, now) if late else None
                    if spare is not None:  # waiting for its answer counts like a dial: it may become our link
                        policy.announced[peer] = now
                        policy.dialing.add(peer)
                        self._nursery.start_soon(self._contained, peer, self._announce, policy, peer, spare)
                    continue
                policy.dialing.add(peer)
                self._nursery.start_soon(self._contained, peer, self._dial_link, policy, peer, dial,
                                         self._take_spare(peer, now))
        self._keep_spares(peers, dial, max_links, now)

    def _holds_as_follower(self, policy: MirroredPolicy) -> bool:
        """Whether this peer holds `policy` complete and did not sign it: it then opens no top-up links (its own half
        still opens at once), and serves over every link others open to it.

        Why: a top-up link brings its opener more sources, which a peer holding every piece does not need; the
        neighbours still fetching top up themselves. With a small version, which every peer held within a second,
        14 of each peer's 16 link ends per version opened after it held the version, half of them top-ups at 5 s,
        each a channel, a preamble, two hellos and a teardown at both ends for nothing. The origin keeps topping
        up: at first it is the only source there is."""
        service = policy.service
        return service is not None and service.completed.is_set() and policy.origin != self.my_id

    def reconcile_pause(self) -> float:
        """Seconds until the next `reconcile` round: RECONCILE_BUSY_S while some version is incomplete here or
        signed by this peer (its first source: a large version spreads for minutes, and a link to it that drops is
        replaced at once), else RECONCILE_IDLE_S."""
        settled = all(self._holds_as_follower(policy) for policy in self.policies.values())
        return RECONCILE_IDLE_S if settled else RECONCILE_BUSY_S

    def _pop_spare(self, peer: str) -> tuple[Any, float] | None:
        """Remove our spare to `peer` (the channel and when it retires), with its peer's absence, if any."""
        self._spare_absent.pop(peer, None)
        return self._spares.pop(peer, None)

    def _take_spare(self, peer: str, now: float) -> Any:
        spare = self._pop_spare(peer)
        if spare is None:
            return None
        if now > spare[1]:  # the acceptor stops waiting for it soon: close it cleanly, not by GC
            self._nursery.start_soon(trio.aclose_forcefully, spare[0])
            return None
        return spare[0]

    def _keep_spares(self, peers: list[str], dial: Dialer, max_links: int, now: float) -> None:
        present = set(peers)
        for peer, (stream, retire_at) in list(self._spares.items()):
            # age retires a spare (the acceptor stops waiting soon after), and so does its peer's absence past
            # SPARE_ABSENT_GRACE; a spare that died meanwhile fails when used and is dialed anew
            if peer in present:
                self._spare_absent.pop(peer, None)
                gone_for = 0.0
            else:
                gone_for = now - self._spare_absent.setdefault(peer, now)
            if now > retire_at or gone_for > SPARE_ABSENT_GRACE:
                self._pop_spare(peer)
                self._nursery.start_soon(trio.aclose_forcefully, stream)
        for peer in peers:
            if (peer == self.my_id or peer in self._spares or peer in self._spare_dialing
                    or len(self._spares) + len(self._spare_dialing) >= max_links
                    or now < self._spare_failures.get(peer, (-math.inf, 0.0))[0]):
                continue
            self._spare_dialing.add(peer)
            self._nursery.start_soon(self._contained, peer, self._dial_spare, peer, dial)

    def _spare_failed(self, peer: str) -> None:
        """Back off spare dials to `peer`, doubling the pause from SPARE_RETRY up to SPARE_RETRY_MAX.

        Why: each spare dial to a peer that never accepts a data channel (a stranger without the protocol, or one
        refusing us) costs a libp2p stream and a protocol negotiation; at one every 2 s, sixteen such identities
        took about an eighth of the CPU a target spent under attack. A success resets the pause."""
        delay = min(SPARE_RETRY_MAX, 2 * self._spare_failures.get(peer, (0.0, SPARE_RETRY / 2))[1])
        self._spare_failures[peer] = (trio.current_time() + delay, delay)

    async def _dial_spare(self, peer: str, dial: Dialer) -> None:
        try:
            with trio.fail_after(self.dial_timeout):
                stream = await dial(peer)
            self._spares[peer] = (stream, trio.current_time() + spare_lifetime(self.spare_ttl))
            self._spare_failures.pop(peer, None)
            self.on_event(Spare(peer=peer))
        except _DIAL_ERRORS as exc:
            _raise_breach(exc)
            self._spare_failed(peer)
            log.debug("spare data channel to %s failed: %s", peer, exc)
        finally:
            self._spare_dialing.discard(peer)

    async def _announce(self, policy: MirroredPolicy, peer: str, stream: Any) -> None:
        """Hand a signed manifest to a peer over our spare channel to it; the peer dials the link, over this very
        channel when it can (its preamble comes back on it, see `_link_over_announcement`), else it closes it."""
        try:
            try:
                with trio.fail_after(self.dial_timeout):
                    await send_preamble(stream, policy.manifest.id, inline_manifest(policy.signed))
                answer = await self._read_preamble(stream, self.dial_timeout + self.transfer.handshake_timeout)
            finally:  # answered (the link registers before it first waits) or not: no longer in flight
                policy.dialing.discard(peer)
            if answer is not None:
                policy.opened.add(peer)
                await self._route(peer, stream, answer.route, answer.signed)
        except _DIAL_ERRORS as exc:
            _raise_breach(exc)
            log.debug("announcing a manifest failed: %s", exc)
        finally:
            await trio.aclose_forcefully(stream)

    async def _dial_link(self, policy: MirroredPolicy, peer: str, dial: Dialer, spare: Any = None) -> None:
        started = trio.current_time()
        try:
            with trio.fail_after(self.dial_timeout):
                stream = spare if spare is not None else await dial(peer)
                await send_preamble(stream, policy.manifest.id, inline_manifest(policy.signed))
            # garbage-collected while we dialed, the peer banned meanwhile, or its service stopped (the node is
            # shutting down): no new links
            if (not self.is_mirrored(policy) or not self._may_link(policy, peer)
                    or not policy.service.add_link(peer, stream)):
                await trio.aclose_forcefully(stream)
                return
            policy.opened.add(peer)
            self._linked(policy, peer, dir="out", dial_s=round(trio.current_time() - started, 3),
                         spare=spare is not None)
        except _DIAL_ERRORS as exc:
            _raise_breach(exc)
            policy.failures[peer] = trio.current_time()
            log.debug("data channel to %s failed: %s", peer, exc)
        finally:
            policy.dialing.discard(peer)


def spare_lifetime(ttl: float, draw: Callable[[], float] = random.random) -> float:
    """How long one spare channel is kept: `ttl` less up to SPARE_TTL_SPREAD of it, drawn per spare. Why drawn: the
    spares of peers that joined together were renewed together, every `ttl`, in a burst of a dial per neighbour on
    every peer at once; never more than `ttl`, which the acceptor waits for a preamble (PolicyMirror._read_preamble)."""
    return ttl * (1.0 - SPARE_TTL_SPREAD * draw())


def _enough_links(policy: MirroredPolicy, wanted: int, own_half_only: bool = False) -> bool:
    """Whether a version has the links this peer opens for it: `wanted` in all (dials and announcements under way
    included), at least half of them opened by this peer; while `own_half_only` (the version's first TOP_UP_AFTER
    seconds here, and once this peer holds it without having signed it), only that own half. Why half its own: links
    others open cost as much as ours and count too, but identities that link a peer the moment a version appears (or
    hand it the version themselves) could otherwise take every place with links that carry nothing, and the peer
    would open none."""
    links = set(policy.service.peers)
    own = len(links & policy.opened) + len(policy.dialing)
    half = (wanted + 1) // 2
    return own >= half and (own_half_only or len(links) + len(policy.dialing) >= wanted)


def link_order(manifest_id: bytes, salt: bytes, peers: list[str],
               last: set[str] | frozenset[str] = frozenset()) -> list[str]:
    """`peers` in the order a peer links them for a version (BLAKE3 of the manifest id, the peer's secret `salt`
    and each peer id), those in `last` (the version's dropped links) after all others. Stable while the version
    lasts, so reconcile rounds agree on whom to link; different for the next version, so each spreads over other
    neighbours; a peer dropped for stalling gives its place to the next one instead of taking it again. Each peer
    draws its own, and in secret: an order shared by all made the same few neighbours everyone's first links, and
    one computable by others lets identities ground for it once the version is out come first."""
    return sorted(peers, key=lambda peer: (peer in last, blake3.blake3(manifest_id + salt + peer.encode()).digest()))


def _raise_breach(exc: BaseException) -> None:
    """A failed dial is routine unless the peer broke the handshake: that one goes on up, to ban the peer."""
    if isinstance(exc, HandshakeBreach):
        raise exc
