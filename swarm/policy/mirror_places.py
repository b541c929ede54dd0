"""The policy mirror's link places: who may hold one, and when a link gives its place up.

A mixin of swarm.policy.mirror.PolicyMirror (its state lives there: policies, the served record); the decisions are
swarm.policy.link_places's pure functions, fed here with what each version's service says its links carried.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable

import trio

from p2p.pieces.transfer_stats import LinkActivity
from swarm.policy.link_places import admit, idle
from swarm.policy.mirrored import MirroredPolicy

log = logging.getLogger("swarm.policy.mirror")
TEND_EVERY = 1.0
"""Seconds between two looks at a version's links (what they moved, which idle): a look reads every link's have-map,
and the rounds that open links run four times a second while a version is fetched."""
MAX_PROVIDERS = 20  # peers per version the DHT named as its providers, trusted with its links
MAX_RELEASED = 4096  # peers per version whose link was released as idle (bounds only the memory of a crowd)


class LinkPlaces:
    """Places side of PolicyMirror: links others open are admitted or refused, idle links released."""

    def trusted_for(self, policy: MirroredPolicy) -> Callable[[str], bool]:
        """Whom this peer trusts with `policy`'s links: its origin, the providers the DHT named for it, and peers
        that moved verified pieces with us before (swarm.policy.served_record)."""
        return lambda peer: peer == policy.origin or peer in policy.providers or self.served.trusted(peer)

    def linked_peers(self) -> set[str]:
        """Peers we hold a data link or a spare channel with, or are dialing for one."""
        linked = set(self._spares) | self._spare_dialing
        for policy in list(self.policies.values()):
            linked |= policy.dialing
            if policy.service is not None:
                linked |= set(policy.service.peers)
        return linked

    def trust_rank(self, policy: MirroredPolicy) -> Callable[[str], tuple]:
        """Trusted peers' order for `policy`'s own links: its origin, then by what each did for us, then providers."""
        return lambda peer: (peer == policy.origin, self.served.score(peer))

    def note_providers(self, manifest_id: bytes, peers: Iterable[str]) -> None:
        """Peers the DHT named as providers of the version (at most MAX_PROVIDERS kept): a fallback, ranked below
        the peers that moved pieces with us, since any identity may announce itself as one."""
        policy = self.policies.get(manifest_id)
        if policy is None:
            return
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

    def _admit(self, policy: MirroredPolicy, peer: str) -> bool:
        """Whether a link `peer` opened for `policy` takes a place (closing the link it replaces, if any)."""
        if peer in policy.opened:
            return True  # it answered our announcement: the link is ours
        trusted = self.trusted_for(policy)
        if peer in policy.released and not trusted(peer):
            return False  # it held a place of this version for nothing once already
        now = trio.current_time()
        decision = admit(peer, self._theirs(policy, now), places=self.stranger_places, now=now, trusted=trusted,
                         idle_after=self.idle_after)
        if decision.evict is not None:
            self._release(policy, decision.evict, "gave its place to a newcomer after carrying nothing lately")
        if decision.admit:
            policy.admitting[peer] = now
        return decision.admit

    def _tend_places(self, policy: MirroredPolicy, now: float) -> None:
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
