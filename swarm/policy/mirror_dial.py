"""This peer's outbound links: the links of each version it opens itself, dialed or announced, and how often it looks.

Link rules (why): data channels are per (peer, manifest). The dialer writes the 32-byte manifest id first, so the
acceptor can route the link without guessing (swarm.policy.inbound_links). For each pair of peers only the one with
the smaller peer id dials, so two peers never open crossing duplicate links; it also keeps one spare channel open to
each such peer (swarm.policy.spares), so a new version's link does not wait seconds for a dial (see `reconcile`). A
peer with the larger id that holds a version first announces it over its own spare; the smaller peer then dials the
link over that same channel by writing its preamble back. A peer opens links (dials or announcements) for a version
only while it has fewer than `links_per_version` (at least half of them its own, trusted peers first:
swarm.policy.link_places, which also says who holds the places others open); others may link to it. Why: each link
costs a data channel, a handshake and a have message per piece, so a peer linking every version to all of its
neighbours paid in proportion to them (6 % of a core per peer at 8 peers and 12 % at 16, one version every 20 s); in
virtual time 8 links per peer finish a broadcast within 1.3x of the bound at 64 to 1,000 peers. For a version's
first `top_up_after` seconds a peer opens only its own half: all peers opening every place at once, before the links
others chose to open to them arrived, left each with about twice as many (15.7 per version at 64 peers, where 8 were
meant). A peer holding a version it did not sign opens no top-ups for it: they would bring it sources it no longer
needs (`OutboundLinks._holds_as_follower`). A peer that does not re-seed (the single-origin baseline) links only
with the manifest's origin, the trainer's peer.

Every task started here runs contained (swarm.policy.mirror.PolicyMirror), so nothing a peer sends (a malformed
offer, a broken preamble) and no bug in handling it can end the mirror's nursery, and with it the node.
"""

from __future__ import annotations

import logging
import math
import secrets
from collections.abc import Callable

import blake3
import trio

from p2p.pieces.wire import Stream
from swarm.policy.inbound_links import InboundLinks, Linked
from swarm.policy.link_places import choose_order
from swarm.policy.link_preamble import inline_manifest, send_preamble
from swarm.policy.mirror_places import LinkPlaces
from swarm.policy.mirrored import MirroredPolicy
from swarm.policy.spares import DIAL_ERRORS, Dialer, SpareChannels, StartWith, raise_breach

log = logging.getLogger("swarm.policy.mirror")
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


class OutboundLinks:
    """The links this peer opens itself: `reconcile` dials or announces what each version still needs."""

    def __init__(self, my_id: str, policies: dict[bytes, MirroredPolicy], banned: dict[str, str], *,
                 spares: SpareChannels, places: LinkPlaces, inbound: InboundLinks, start_with: StartWith,
                 is_mirrored: Callable[[MirroredPolicy], bool], may_link: Callable[[MirroredPolicy, str], bool],
                 linked: Linked, links_per_version: int, top_up_after: float, announce_after: float,
                 dial_timeout: float, handshake_timeout: float) -> None:
        self.my_id = my_id
        self.policies = policies  # the mirror's versions, by manifest id
        self.banned = banned  # peer -> the protocol breach it is never linked for
        self.spares = spares
        self.places = places
        self.inbound = inbound  # reads the answers to our announcements, and serves the links they name
        self._start_with = start_with
        self._is_mirrored = is_mirrored
        self._may_link = may_link
        self._linked = linked
        # links a version needs before this peer stops opening (dials or announcements) its own; others may add more
        self.links_per_version = links_per_version
        self.top_up_after = top_up_after  # before this, a version's own half only (_enough_links)
        # a smaller peer that has not dialed a version's link this long after we adopted it is told of the version
        # (gossip reached some peers 5-21 s late under load); sooner, most announcements crossed the peer's own link
        self.announce_after = announce_after
        self.dial_timeout = dial_timeout
        self.handshake_timeout = handshake_timeout
        # this process's secret in its link order (link_order): nobody can grind identities to be first
        self.link_salt = secrets.token_bytes(16)

    async def reconcile(self, peers: list[str], dial: Dialer, max_links: int) -> None:
        """Open the links this peer should dial: smaller peer id dials, failed dials back off.

        Why spares: opening a data channel costs a few libp2p round trips, measured at 2.5-4.6 s per dial on a
        loaded machine with several peers starting, longer than the whole transfer of a small policy. So every
        peer we dial keeps one channel open ahead of need, and a new version's link takes it and only writes its
        manifest id.
        """
        now = trio.current_time()
        self.inbound.max_links = max_links
        peers = [peer for peer in peers if peer not in self.banned]
        wanted = min(max_links, self.links_per_version)
        for policy in list(self.policies.values()):
            service = policy.service
            if service is None or service._nursery is None:
                continue
            self.places.tend(policy, now)  # idle links give their places up first
            own_half_only = now - policy.adopted_at < self.top_up_after or self._holds_as_follower(policy)
            if _enough_links(policy, wanted, own_half_only):
                continue  # most rounds: nothing to open, so no order to draw (every round, every version)
            drawn = link_order(policy.manifest.id, self.link_salt, peers, last=policy.dropped | policy.released)
            trusted = self.places.trusted_for(policy)
            for peer in choose_order(drawn, trusted, (wanted + 1) // 2, policy.dropped, policy.released,
                                     self.places.trust_rank(policy)):
                if _enough_links(policy, wanted, own_half_only):
                    break
                if (peer == self.my_id or peer in service.peers or peer in policy.dialing
                        or self.spares.dialing(peer)  # about to be there: a second dial would only compete
                        or not self._may_link(policy, peer) or now - policy.failures.get(peer, -math.inf) < 2.0):
                    continue
                if peer < self.my_id:  # its link is the peer's to dial: tell it about the manifest if it is late
                    late = (now - policy.announced.get(peer, -math.inf) >= ANNOUNCE_AGAIN_AFTER
                            and now - policy.adopted_at >= self.announce_after)
                    spare = self.spares.take(peer, now) if late else None
                    if spare is not None:  # waiting for its answer counts like a dial: it may become our link
                        policy.announced[peer] = now
                        policy.dialing.add(peer)
                        self._start_with(peer, self._announce, policy, peer, spare)
                    continue
                policy.dialing.add(peer)
                self._start_with(peer, self._dial_link, policy, peer, dial, self.spares.take(peer, now))
        self.spares.keep(peers, dial, max_links, now)

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

    async def _announce(self, policy: MirroredPolicy, peer: str, stream: Stream) -> None:
        """Hand a signed manifest to a peer over our spare channel to it; the peer dials the link, over this very
        channel when it can (its preamble comes back on it, see `InboundLinks._link_over_announcement`), else it
        closes it."""
        try:
            try:
                with trio.fail_after(self.dial_timeout):
                    await send_preamble(stream, policy.manifest.id, inline_manifest(policy.signed))
                answer = await self.inbound.read_preamble(stream, self.dial_timeout + self.handshake_timeout)
            finally:  # answered (the link registers before it first waits) or not: no longer in flight
                policy.dialing.discard(peer)
            if answer is not None:
                policy.opened.add(peer)
                await self.inbound.route(peer, stream, answer.route, answer.signed)
        except DIAL_ERRORS as exc:
            raise_breach(exc)
            log.debug("announcing a manifest failed: %s", exc)
        finally:
            await trio.aclose_forcefully(stream)

    async def _dial_link(self, policy: MirroredPolicy, peer: str, dial: Dialer, spare: Stream | None = None) -> None:
        started = trio.current_time()
        try:
            with trio.fail_after(self.dial_timeout):
                stream = spare if spare is not None else await dial(peer)
                await send_preamble(stream, policy.manifest.id, inline_manifest(policy.signed))
            # garbage-collected while we dialed, the peer banned meanwhile, or its service stopped (the node is
            # shutting down): no new links
            if (not self._is_mirrored(policy) or not self._may_link(policy, peer)
                    or not policy.service.add_link(peer, stream)):
                await trio.aclose_forcefully(stream)
                return
            policy.opened.add(peer)
            self._linked(policy, peer, dir="out", dial_s=round(trio.current_time() - started, 3),
                         spare=spare is not None)
        except DIAL_ERRORS as exc:
            raise_breach(exc)
            policy.failures[peer] = trio.current_time()
            log.debug("data channel to %s failed: %s", peer, exc)
        finally:
            policy.dialing.discard(peer)


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
