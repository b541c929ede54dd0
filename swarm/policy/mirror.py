"""Following a run's policy versions: one piece-protocol service per manifest inside the window.

Every role holds a PolicyMirror. It admits only manifests signed by the run's trainer key (swarm.policy.trust), keeps
the newest `keep` versions and garbage-collects older ones, and runs each version's service and every link task in
its nursery. Its parts each own their state: the links others open (swarm.policy.inbound_links), the links this peer
opens (swarm.policy.mirror_dial, which states the link rules), the spare channels they take (swarm.policy.spares)
and the places links hold (swarm.policy.mirror_places). The mirror keeps what they share: the versions, the peers
banned for a breach, and the link events.
"""

from __future__ import annotations

import logging
import math
import shutil
from collections.abc import Awaitable, Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

import trio

from p2p.budget import ByteRate
from p2p.channel.messages import HandshakeBreach
from p2p.errors import P2PError
from p2p.identity import peer_id_from_public_bytes
from p2p.pieces.manifest import decode_signed, verify_manifest
from p2p.pieces.store import PieceStore
from p2p.pieces.transfer import SwarmService, TransferConfig
from p2p.pieces.wire import Stream
from p2p.ratelimit import TokenBucket
from swarm.event_types import Adopted, Complete, Dropped, Event, Link, PeerDropped, Refused
from swarm.policy.inbound_links import InboundLinks
from swarm.policy.link_places import LINK_IDLE_AFTER
from swarm.policy.link_preamble import PREAMBLE_RATE
from swarm.policy.mirror_dial import TOP_UP_AFTER, OutboundLinks
from swarm.policy.mirror_places import MAX_RELEASED, LinkPlaces
from swarm.policy.mirrored import MirroredPolicy
from swarm.policy.patch_form import form_flags, make_full, patch_parent
from swarm.policy.spares import SPARE_TTL, Dialer, SpareChannels
from swarm.policy.trust import TrainerTrust

log = logging.getLogger(__name__)
MAX_BANNED = 4096  # peers remembered as hostile (a liar can make new identities; this only bounds the memory)


class PolicyMirror:
    """The set of policy versions a peer mirrors, and the piece services that move them.

    Its link settings are given at construction and held by the part that uses them (`inbound`, `outbound`,
    `spares`, `places`), one copy each."""

    def __init__(self, store: PieceStore, my_id: str, trust: TrainerTrust, *, run: str,
                 transfer: TransferConfig = TransferConfig(), upload_bps: float = math.inf, reseed: bool = True,
                 keep: int = 3,
                 on_event: Callable[[Event], None] = lambda event: None, dial_timeout: float = 15.0,
                 spare_ttl: float = SPARE_TTL, adoption_wait: float = 30.0, announce_after: float = 1.0,
                 copies_dir: Path | None = None, preamble_rate: ByteRate = PREAMBLE_RATE,
                 links_per_version: int = 8, top_up_after: float = TOP_UP_AFTER, stranger_places: int | None = None,
                 idle_after: float = LINK_IDLE_AFTER) -> None:
        self.store = store
        # where versions are reassembled into loadable files (swarm.policy.files); each copy goes with its version
        self.copies_dir = copies_dir
        self.my_id = my_id
        self.trust = trust
        self.run = run
        self.transfer = transfer
        # this peer's whole upload (bytes/s, --upload-mbps), one bucket that every version's service draws on
        self.upload_bucket = TokenBucket(upload_bps)
        self.reseed = reseed
        self.keep = keep
        self.on_event = on_event
        self._held: dict[bytes, int] = {}  # manifest id -> readers reassembling it in a worker thread
        self.banned: dict[str, str] = {}  # peer -> the protocol breach (a corrupt piece...) it is never linked for
        self._gone: set[str] = set()  # peers whose departure was reported and that have not linked since
        self.policies: dict[bytes, MirroredPolicy] = {}
        self.changed = trio.Event()  # set (and replaced) whenever a version is adopted or completes
        self._nursery: trio.Nursery | None = None
        # a data-channel dial takes seconds on a loaded machine, but a libp2p stream open that hangs waits 30 s:
        # `dial_timeout` gives up sooner and retries, since a missing link leaves its peer to the seed
        self.spares = SpareChannels(my_id, ttl=spare_ttl, dial_timeout=dial_timeout,
                                    on_event=lambda event: self.on_event(event),
                                    close=self._close_soon, start_with=self._start_with)
        self.places = LinkPlaces(my_id, idle_after=idle_after, dial_timeout=dial_timeout,
                                 stranger_places=max(1, links_per_version // 2) if stranger_places is None
                                 else stranger_places)
        self.inbound = InboundLinks(my_id, self.policies, self.banned, places=self.places, adopt=self.adopt,
                                    changed=lambda: self.changed, is_mirrored=self.is_mirrored,
                                    may_link=self._may_link, ban=self._ban, linked=self._linked,
                                    adoption_wait=adoption_wait, dial_timeout=dial_timeout, spares=self.spares,
                                    handshake_timeout=transfer.handshake_timeout, preamble_rate=preamble_rate)
        self.outbound = OutboundLinks(my_id, self.policies, self.banned, spares=self.spares, places=self.places,
                                      inbound=self.inbound, start_with=self._start_with,
                                      is_mirrored=self.is_mirrored, may_link=self._may_link, linked=self._linked,
                                      links_per_version=links_per_version, top_up_after=top_up_after,
                                      announce_after=announce_after, dial_timeout=dial_timeout,
                                      handshake_timeout=transfer.handshake_timeout)

    # ---------------------------------------------------------------- service lifetime

    async def run_service(self, *, task_status: trio.TaskStatus[PolicyMirror] = trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            for signed in self._stored_signed():
                self.adopt(signed)
            self._prune_copies()  # copies an earlier process left of versions no longer held
            task_status.started(self)
            await trio.sleep_forever()

    def _stored_signed(self) -> list[bytes]:
        out = []
        for m in self.store.manifests():
            try:
                out.append(self.store.signed_manifest_bytes(m.id))
            except P2PError:
                continue
        return out

    # ---------------------------------------------------------------- adopting versions

    def latest(self) -> MirroredPolicy | None:
        return max(self.policies.values(), key=lambda p: p.manifest.version, default=None)

    def complete_versions(self) -> list[MirroredPolicy]:
        return sorted((p for p in self.policies.values() if p.ready.is_set()), key=lambda p: p.manifest.version)

    def adopt(self, signed: bytes, local_dir: Path | None = None) -> MirroredPolicy | None:
        """Verify a signed manifest and start mirroring it; None when refused (logged) or outside the window."""
        try:
            outer = decode_signed(signed)
            if self.trust.key is not None and outer.public_key != self.trust.key:  # refused before any decoding
                raise P2PError(self.trust.wrong_key(outer.public_key))
            # verified against its own signer and checked for our run BEFORE a first-use key is trusted: forged
            # bytes or another run's manifest pinned on disk would have every real one refused
            manifest = verify_manifest(signed, outer.public_key)
            if manifest.run != self.run:
                log.warning("refused a manifest of run %r (this peer follows %r)", manifest.run, self.run)
                return None
            if not self.trust.accept(outer.public_key):
                raise P2PError(self.trust.wrong_key(outer.public_key))
        except P2PError as exc:  # said once, as an event, at most once a minute (swarm.policy.trust.RefusalReport)
            line = self.trust.report.refused(str(exc), trio.current_time())
            if line is not None:
                self.on_event(Refused(reason=line))
            return None
        if manifest.id in self.policies:
            return self.policies[manifest.id]
        newest = self.latest()
        if newest is not None and manifest.version <= newest.manifest.version - self.keep:
            return None

        policy = MirroredPolicy(manifest, signed, peer_id_from_public_bytes(outer.public_key),
                                adopted_at=trio.current_time())
        if local_dir is not None:
            self.store.add_local_policy(manifest, local_dir, signed)
        else:
            self.store.add_manifest(manifest, signed)
        self.policies[manifest.id] = policy
        self._start_service(policy)
        self._collect_garbage()
        self.on_event(Adopted(version=manifest.version, id=manifest.id.hex(), bytes=manifest.total_size,
                              pieces=manifest.num_pieces))
        self._signal()
        return policy

    def _start_service(self, policy: MirroredPolicy) -> None:
        assert self._nursery is not None, "run_service must be started first"
        handshake = max(self.transfer.handshake_timeout, self.inbound.adoption_wait + 5)
        config = replace(self.transfer, handshake_timeout=handshake)
        if policy.origin == self.my_id and policy.manifest.patch is None:
            # The origin's upload is the bottleneck of a flash crowd: super-seed so no piece goes out twice while
            # another has never gone out (docs/reference.md#torrent-mechanics). Not for a version with a patch:
            # its peers want one of two forms, and a piece revealed to a peer that does not want it is wasted.
            config = replace(config, engine=replace(config.engine, super_seed=True))
        held = self.store.holds_full(policy.manifest)  # a restart: nothing to fetch, no patch to apply
        policy.parent = None if held else patch_parent(policy.manifest, self.policies)
        policy.service = SwarmService(policy.manifest, self.store, config=config, upload_bucket=self.upload_bucket,
                                      on_drop=lambda peer, why, hostile: self._dropped(policy, peer, why, hostile),
                                      wanted=form_flags(policy.manifest, patch_form=policy.parent is not None))
        policy.scope = trio.CancelScope()

        async def serve() -> None:
            with policy.scope:
                async with trio.open_nursery() as nursery:
                    await nursery.start(policy.service.run)
                    nursery.start_soon(self._watch_completion, policy)

        self._nursery.start_soon(serve)

    def _dropped(self, policy: MirroredPolicy, peer: str, why: str, hostile: bool) -> None:
        """A version's service dropped `peer`: say so, and ban a hostile peer from every version (each would cost
        a piece download again); a peer that merely left or stalled may be linked again when it is back."""
        if len(policy.dropped) < MAX_RELEASED:  # identities are free: the memory of a crowd is bounded
            policy.dropped.add(peer)
        policy.opened.discard(peer)
        if hostile:
            self._ban(peer, why)
        else:
            if peer in self._gone:  # a peer that left ends the links of every version at once: say it once
                return
            if len(self._gone) < MAX_BANNED:
                self._gone.add(peer)
        self.on_event(PeerDropped(version=policy.manifest.version, dropped=peer, reason=why, banned=hostile))

    def _ban(self, peer: str, why: str) -> None:
        """Never link `peer` again, and close our spare channel to it."""
        if peer in self.banned or len(self.banned) >= MAX_BANNED:
            return
        self.banned[peer] = why
        self.spares.close(peer)

    def _linked(self, policy: MirroredPolicy, peer: str, *, dir: str, via: str | None = None,
                dial_s: float | None = None, spare: bool | None = None) -> None:
        """Report a data link of `policy` opened with `peer` (swarm.policy.inbound_links.Linked)."""
        self._gone.discard(peer)  # back: its next departure is news again
        self.on_event(Link(peer=peer, version=policy.manifest.version, dir=dir, via=via, dial_s=dial_s, spare=spare))

    async def _watch_completion(self, policy: MirroredPolicy) -> None:
        await make_full(policy, self.store, policy.parent, self.is_mirrored, lambda: self.changed, self.holding)
        policy.parent = None  # a version never keeps its parent (and through it the run's history) alive
        policy.ready.set()
        policy.announced_complete = True
        self.on_event(Complete(version=policy.manifest.version, id=policy.manifest.id.hex()))
        self._signal()

    @contextmanager
    def holding(self, policy: MirroredPolicy) -> Iterator[None]:
        """Keep `policy` and its files out of garbage collection while a worker thread reads them (versions turn
        over every few seconds, and a store must not close files under a reading thread)."""
        mid = policy.manifest.id
        self._held[mid] = self._held.get(mid, 0) + 1
        try:
            yield
        finally:
            self._held[mid] -= 1
            if not self._held[mid]:
                del self._held[mid]

    def _collect_garbage(self) -> None:
        newest = self.latest()
        if newest is None:
            return
        for mid, policy in list(self.policies.items()):
            if mid in self._held:  # dropped by the next collection, once its reader is done
                continue
            if policy.manifest.version <= newest.manifest.version - self.keep:
                if policy.scope is not None:
                    policy.scope.cancel()
                del self.policies[mid]
                policy.parent = None  # its watcher may never have run to clear it: nothing keeps history alive
                self.on_event(Dropped(version=policy.manifest.version))
        self.store.gc(self.keep, pinned=set(self.policies))
        self._prune_copies()

    def copy_dir(self, policy: MirroredPolicy) -> Path:
        """Where `policy` is reassembled into files a model loads (they go when the version leaves the window)."""
        if self.copies_dir is None:
            raise RuntimeError("this mirror was built without a copies_dir")
        return self.copies_dir / f"v{policy.manifest.version}-{policy.manifest.id.hex()[:12]}"

    def _prune_copies(self) -> None:
        """Delete reassembled copies of versions no longer mirrored (held ones stay mirrored until released): the
        disk holds the window's copies, never one per version of a long run."""
        if self.copies_dir is None or not self.copies_dir.is_dir():
            return
        wanted = {self.copy_dir(p).name for p in self.policies.values()}
        for entry in self.copies_dir.iterdir():
            if entry.name in wanted:
                continue
            if entry.is_dir():
                shutil.rmtree(entry, ignore_errors=True)
            else:
                entry.unlink(missing_ok=True)

    def _signal(self) -> None:
        self.changed.set()
        self.changed = trio.Event()

    # ---------------------------------------------------------------- links

    async def accept_link(self, peer: str, stream: Stream) -> None:
        """Serve an inbound data channel (swarm.policy.inbound_links.InboundLinks.accept_link)."""
        await self.inbound.accept_link(peer, stream)

    async def reconcile(self, peers: list[str], dial: Dialer, max_links: int) -> None:
        """Open the links this peer should dial (swarm.policy.mirror_dial.OutboundLinks.reconcile)."""
        await self.outbound.reconcile(peers, dial, max_links)

    def reconcile_pause(self) -> float:
        """Seconds until the next `reconcile` round (swarm.policy.mirror_dial.OutboundLinks.reconcile_pause)."""
        return self.outbound.reconcile_pause()

    def linked_peers(self) -> set[str]:
        """Peers we hold a data link or a spare channel with, or are dialing for one."""
        linked = self.spares.peers()
        for policy in list(self.policies.values()):
            linked |= policy.dialing
            if policy.service is not None:
                linked |= set(policy.service.peers)
        return linked

    def note_providers(self, manifest_id: bytes, peers: Iterable[str]) -> None:
        """Peers the DHT named as providers of the version: trusted with its links (LinkPlaces.note_providers)."""
        policy = self.policies.get(manifest_id)
        if policy is None:
            return
        self.places.note_providers(policy, peers)

    # ---------------------------------------------------------------- tasks with one peer

    def _close_soon(self, stream: Stream) -> None:
        """Close `stream` in the mirror's nursery: cleanly, not by GC."""
        self._nursery.start_soon(trio.aclose_forcefully, stream)

    def _start_with(self, peer: str, task: Callable[..., Awaitable[None]], *args: object) -> None:
        """Run `task(*args)`, a task with `peer`, in the mirror's nursery, contained (`_contained`)."""
        self._nursery.start_soon(self._contained, peer, task, *args)

    async def _contained(self, peer: str, task: Callable[..., Awaitable[None]], *args: object) -> None:
        """Run one of the mirror's tasks with `peer`: whatever it raises costs that peer (a handshake breach bans
        it, anything else backs its dials off), never the mirror's nursery, whose end would stop the node (a peer
        answering an offer with a field of the wrong type could otherwise stop every node it connects to)."""
        try:
            await task(*args)
        except HandshakeBreach as exc:
            log.warning("banned peer %s: %s", peer, exc)
            self._ban(peer, f"broke the data channel handshake: {exc}")
        except Exception as exc:  # noqa: BLE001 - one peer's input or our bug with it: that peer's task ends
            self.spares.failed(peer)
            log.warning("data channel task with %s failed: %s: %s", peer, type(exc).__name__, exc)
            log.debug("data channel task traceback", exc_info=True)

    # ---------------------------------------------------------------- who may link

    def _may_link(self, policy: MirroredPolicy, peer: str) -> bool:
        """Whether this pair may share `policy`: never with a banned peer (checked again once a dial or a preamble
        wait is over, since the ban may have come meanwhile); without re-seeding, only with the origin."""
        if peer in self.banned:
            return False
        return self.reseed or peer == policy.origin or self.my_id == policy.origin

    def is_mirrored(self, policy: MirroredPolicy) -> bool:
        """Whether `policy` is still mirrored: a newer version may have pushed it out of the window meanwhile, and
        a dropped version's service takes no more links."""
        return self.policies.get(policy.manifest.id) is policy and not (policy.scope and policy.scope.cancel_called)
