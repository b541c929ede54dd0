"""A version's link places: whom this peer trusts with them, who may hold one, and when a link gives its place up.

The decisions are swarm.policy.link_places's pure functions, fed here with what each version's service says its
links carried and with the record of peers that moved verified pieces with us (swarm.policy.served_record).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable

import trio

from p2p.pieces.transfer_stats import LinkActivity
from swarm.policy.link_places import admit as admission
from swarm.policy.link_places import idle
from swarm.policy.mirrored import MirroredPolicy
from swarm.policy.served_record import ServedRecord

log = logging.getLogger("swarm.policy.mirror")
TEND_EVERY = 1.0
"""Seconds between two looks at a version's links (what they moved, which idle): a look reads every link's have-map,
and the rounds that open links run four times a second while a version is fetched."""
MAX_PROVIDERS = 20  # peers per version the DHT named as its providers, trusted with its links
MAX_RELEASED = 4096  # peers per version whose link was released as idle (bounds only the memory of a crowd)


class LinkPlaces:
    """A version's link places: links others open are admitted or refused, idle links released."""

    def __init__(self, my_id: str, *, stranger_places: int, idle_after: float, dial_timeout: float) -> None:
        self.my_id = my_id
        # links others open per version (swarm.policy.link_places); a link idle this long gives its place up
        self.stranger_places = stranger_places
        self.idle_after = idle_after
        self.dial_timeout = dial_timeout  # an admitted link writing its preamble back holds a place this long
        self.served = ServedRecord()  # peers that moved verified pieces with us: trusted with link places

    def trusted_for(self, policy: MirroredPolicy) -> Callable[[str], bool]:
        """Whom this peer trusts with `policy`'s links: its origin, the providers the DHT named for it, and peers
        that moved verified pieces with us before (swarm.policy.served_record)."""
        return lambda peer: peer == policy.origin or peer in policy.providers or self.served.trusted(peer)

    def trust_rank(self, policy: MirroredPolicy) -> Callable[[str], tuple[bool, tuple[int, int]]]:
        """Trusted peers' order for `policy`'s own links: its origin, then by what each did for us, then providers."""
        return lambda peer: (peer == policy.origin, self.served.score(peer))

    def note_providers(self, policy: MirroredPolicy, peers: Iterable[str]) -> None:
        """Peers the DHT named as providers of the version (at most MAX_PROVIDERS kept): a fallback, ranked below
        the peers that moved pieces with us, since any identity may announce itself as one."""
        for peer in peers:
            if len(policy.providers) >= MAX_PROVIDERS:
                return
            if peer != self.my_id:
                policy.providers.add(peer)

    def _theirs(self, policy: MirroredPolicy, now: float) -> dict[str, LinkActivity]:
        """The links others opened for `policy`, with what each carried, and those admitted that are still
        writing their preamble back (without them, channels whose preambles came in the same moment were each
        admitted to the same free place)."""
        service = policy.service
        theirs = {}
        for peer in service.peers:
            activity = service.activity(peer)
            if peer not in policy.opened and activity is not None:
                theirs[peer] = activity
        for peer, since in list(policy.admitting.items()):
            if peer in theirs or now - since > self.dial_timeout:
                del policy.admitting[peer]
            else:
                theirs[peer] = LinkActivity(since, since, greeted=False, offers=False, lacks=False)
        return theirs

    def admit(self, policy: MirroredPolicy, peer: str) -> bool:
        """Whether a link `peer` opened for `policy` takes a place (closing the link it replaces, if any)."""
        if peer in policy.opened:
            return True  # it answered our announcement: the link is ours
        trusted = self.trusted_for(policy)
        if peer in policy.released and not trusted(peer):
            return False  # it held a place of this version for nothing once already
        now = trio.current_time()
        decision = admission(peer, self._theirs(policy, now), places=self.stranger_places, now=now, trusted=trusted,
                             idle_after=self.idle_after)
        if decision.evict is not None:
            self._release(policy, decision.evict, "gave its place to a newcomer after carrying nothing lately")
        if decision.admit:
            policy.admitting[peer] = now
        return decision.admit

    def tend(self, policy: MirroredPolicy, now: float) -> None:
        """At most every TEND_EVERY: remember what linked peers moved with us, and release idle links; as a
        super-seed, every round, announce what lapsed promises freed."""
        service = policy.service
        if service.engine.super_seeding:  # every round: a peer waits for pieces whose promises lapsed
            service.reveal_lapsed()
        if now - policy.tended_at < TEND_EVERY:
            return
        policy.tended_at = now
        trusted = self.trusted_for(policy)
        for peer in service.peers:
            stats = service.stats.get(peer)
            if stats is not None:
                self.served.note(peer, stats.pieces_down - stats.pieces_corrupt, stats.pieces_up)
            activity = service.activity(peer)
            if activity is not None and idle(activity, now, self.idle_after, trusted(peer)):
                self._release(policy, peer, "carried nothing it could have carried")

    def _release(self, policy: MirroredPolicy, peer: str, why: str) -> None:
        """Close `peer`'s link for `policy`, linked again for this version only if trusted and chosen by this peer
        (after every other candidate). A peer that moved nothing with us for this version is trusted no more: trust
        earned with a piece of an earlier version was spent holding a place for nothing."""
        log.debug("released the link of %s for version %d: %s", peer, policy.manifest.version, why)
        if len(policy.released) < MAX_RELEASED:
            policy.released.add(peer)
        stats = policy.service.stats.get(peer)
        if stats is None or not (stats.pieces_up or stats.pieces_down):
            self.served.forget(peer)
        policy.service.release(peer, why)
