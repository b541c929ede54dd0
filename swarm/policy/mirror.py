"""Following a run's policy versions: one piece-protocol service per manifest inside the window.

Every role holds a PolicyMirror. It admits only manifests signed by the run's trainer key (swarm.policy.trust), keeps
the newest `keep` versions and garbage-collects older ones, and routes data channels to the right manifest's service.

Link rules (why): data channels are per (peer, manifest). The dialer writes the 32-byte manifest id first, so the
acceptor can route the link without guessing. For each pair of peers only the one with the smaller peer id dials, so
two peers never open crossing duplicate links; it also keeps one spare channel open to each such peer, so a new
version's link does not wait seconds for a dial (see `reconcile`). A peer with the larger id that holds a version
first announces it over its own spare; the smaller peer then dials the link over that same channel by writing its
preamble back. A peer opens links (dials or announcements) for a version only while it has fewer than
`links_per_version` (at least half of them its own, trusted peers first: swarm.policy.link_places, which also says
who holds the places others open); others may link to it. Why: each link costs a data channel, a handshake and a
have message per piece, so a peer linking every version to all of its neighbours paid in proportion to them (6 % of
a core per peer at 8 peers and 12 % at 16, one version every 20 s); in virtual time 8 links per peer finish a
broadcast within 1.3x of the bound at 64 to 1,000 peers. For a version's first `top_up_after` seconds a peer opens
only its own half: all peers opening every place at once, before the links others chose to open to them arrived,
left each with about twice as many (15.7 per version at 64 peers, where 8 were meant). A peer holding a version it
did not sign opens no top-ups for it: they would bring it sources it no longer needs
(`OutboundLinks._holds_as_follower`). A peer that does not re-seed (the single-origin baseline) links only with the
manifest's origin, the trainer's peer.
"""

from __future__ import annotations

import logging
import math
import secrets
import shutil
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

import trio

from p2p.budget import BudgetExhausted, ByteRate
from p2p.channel.messages import HandshakeBreach
from p2p.errors import P2PError
from p2p.identity import peer_id_from_public_bytes
from p2p.pieces.manifest import decode_signed, verify_manifest
from p2p.pieces.store import PieceStore
from p2p.pieces.transfer import SwarmService, TransferConfig
from p2p.ratelimit import TokenBucket
from swarm.event_types import Adopted, Complete, Dropped, Event, Link, PeerDropped, Refused
from swarm.policy.link_places import LINK_IDLE_AFTER
from swarm.policy.link_preamble import PREAMBLE_RATE, Preamble, read_body, read_head, send_preamble
from swarm.policy.mirror_dial import _DIAL_ERRORS, SPARE_TTL, TOP_UP_AFTER, OutboundLinks
from swarm.policy.mirror_places import MAX_RELEASED, LinkPlaces
from swarm.policy.mirrored import MirroredPolicy
from swarm.policy.patch_form import form_flags, make_full, patch_parent
from swarm.policy.served_record import ServedRecord
from swarm.policy.trust import TrainerTrust

log = logging.getLogger(__name__)
MAX_WAITING_PER_PEER = 4  # inbound data channels of one peer still waiting for their manifest id
MAX_WAITING = 64
"""Inbound data channels waiting for their preamble, over all peers: identities are free, so the per-peer limit
alone bounds nothing. When all are taken, the oldest one that has not started its preamble makes room. With a
preamble's 64 KiB cap (swarm.policy.link_preamble) they hold at most 4 MiB of unverified manifests."""
MAX_BANNED = 4096  # peers remembered as hostile (a liar can make new identities; this only bounds the memory)


class PolicyMirror(OutboundLinks, LinkPlaces):
    """The set of policy versions a peer mirrors, and the piece services that move them."""

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
        # a data-channel dial takes seconds on a loaded machine, but a libp2p stream open that hangs waits 30 s:
        # give up sooner and retry, since a missing link leaves its peer to the seed
        self.dial_timeout = dial_timeout
        # gossip delivered a manifest up to 21 s after another peer (measured, 5 processes on a loaded machine): an
        # inbound link for a manifest not adopted yet waits this long, and our own links wait as long for a hello
        self.adoption_wait = adoption_wait
        self.spare_ttl = spare_ttl  # a spare data channel is closed and dialed anew within this (spare_lifetime)
        # a smaller peer that has not dialed a version's link this long after we adopted it is told of the version
        # (gossip reached some peers 5-21 s late under load); sooner, most announcements crossed the peer's own link
        self.announce_after = announce_after
        # links a version needs before this peer stops opening (dials or announcements) its own; others may add more
        self.links_per_version = links_per_version
        self.top_up_after = top_up_after  # before this, a version's own half only (mirror_dial._enough_links)
        # links others open per version (swarm.policy.link_places); a link idle this long gives its place up
        self.stranger_places = max(1, links_per_version // 2) if stranger_places is None else stranger_places
        self.idle_after = idle_after
        self.served = ServedRecord()  # peers that moved verified pieces with us: trusted with link places
        # this process's secret in its link order (mirror_dial.link_order): nobody can grind identities to be first
        self.link_salt = secrets.token_bytes(16)
        self._spares: dict[str, tuple[Any, float]] = {}  # peer -> (open data channel, no manifest yet; retire at)
        self._spare_dialing: set[str] = set()
        self._spare_failures: dict[str, tuple[float, float]] = {}  # peer -> (retry at, pause)
        self._spare_absent: dict[str, float] = {}  # peer holding a spare -> since when it is not connected
        self._max_links = math.inf  # links per version, as the last reconcile was told
        self._waiting: dict[str, int] = {}
        # inbound channels waiting for a preamble's head, oldest first: the scope that ends the wait of each
        self._idle_waits: dict[int, trio.CancelScope] = {}
        self._preamble_rate = preamble_rate  # bytes of preambles read per second, node-wide
        self._held: dict[bytes, int] = {}  # manifest id -> readers reassembling it in a worker thread
        self.banned: dict[str, str] = {}  # peer -> the protocol breach (a corrupt piece...) it is never linked for
        self._gone: set[str] = set()  # peers whose departure was reported and that have not linked since
        self.policies: dict[bytes, MirroredPolicy] = {}
        self.changed = trio.Event()  # set (and replaced) whenever a version is adopted or completes
        self._nursery: trio.Nursery | None = None

    # ---------------------------------------------------------------- service lifetime

    async def run_service(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
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
        config = replace(self.transfer, handshake_timeout=max(self.transfer.handshake_timeout, self.adoption_wait + 5))
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
        spare = self._pop_spare(peer)
        if spare is not None:
            self._nursery.start_soon(trio.aclose_forcefully, spare[0])

    def _linked(self, policy: MirroredPolicy, peer: str, **info: Any) -> None:
        self._gone.discard(peer)  # back: its next departure is news again
        self.on_event(Link(peer=peer, version=policy.manifest.version, **info))

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

    def _may_link(self, policy: MirroredPolicy, peer: str) -> bool:
        """Whether this pair may share `policy`: never with a banned peer (checked again once a dial or a preamble
        wait is over, since the ban may have come meanwhile); without re-seeding, only with the origin."""
        if peer in self.banned:
            return False
        return self.reseed or peer == policy.origin or self.my_id == policy.origin

    async def accept_link(self, peer: str, stream: Any) -> None:
        """Serve an inbound data channel: read the preamble (manifest id + signed manifest), then run the link.

        The preamble may come much later (a warm spare, see `reconcile`), so the wait is long but bounded, and each
        peer may keep only a few channels waiting, the node only MAX_WAITING. A manifest we do not know yet is
        adopted from the preamble (it is verified like any other): gossip delivered manifests 5 s late or never
        under load, and the links must not wait for it. A preamble from a peer with the larger id announces a
        version whose link is ours to dial: we dial it over that same channel (`_link_over_announcement`).
        A breach of the preamble format bans the peer; the node-wide preamble read rate, when spent, drops the
        channel only.
        """
        if self._waiting.get(peer, 0) >= MAX_WAITING_PER_PEER or peer in self.banned or not self._room_to_wait():
            return
        self._waiting[peer] = self._waiting.get(peer, 0) + 1
        try:
            preamble = await self._read_preamble(stream)
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
            await self._route(peer, stream, preamble.route, preamble.signed, wait=0.0)

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

    async def _route(self, peer: str, stream: Any, route: bytes, signed: bytes, wait: float | None = None) -> None:
        """Serve the link a preamble names; from a peer with the larger id it is an announcement, answered below.
        A manifest not adopted yet is waited for `wait` seconds (default: the adoption wait)."""
        if route not in self.policies and signed:
            adopted = self.adopt(signed)
            if adopted is None or adopted.manifest.id != route:
                return
        if peer > self.my_id:
            await self._link_over_announcement(peer, stream, route)
            return
        policy = await self._adopted(route, self.adoption_wait if wait is None else wait)
        if not (policy and policy.service and self._may_link(policy, peer) and self._admit(policy, peer)):
            return  # unknown manifest, not shared with `peer`, or no place for it: the dialer links elsewhere
        self._linked(policy, peer, dir="in")
        await policy.service.serve_link(peer, stream)

    async def _link_over_announcement(self, peer: str, stream: Any, route: bytes) -> None:
        """Dial the announced version's link over the announcing channel itself: write our preamble back on it.

        Why: the link of this pair is ours to dial, and the channel is already open. Dialing anew took one of our
        spares, then a fresh dial to replace it: 119 of the 308 data channels a 6-step `swarm sim` opened. If we
        already have or are dialing that link, or want no more links, we just return (the caller closes it).
        """
        policy = self.policies.get(route)
        if (policy is None or policy.service is None or not self.is_mirrored(policy) or not self._may_link(policy, peer)
                or peer in policy.service.peers or peer in policy.dialing
                or len(policy.service.peers) >= self._max_links or not self._admit(policy, peer)):
            return
        policy.dialing.add(peer)
        try:
            with trio.fail_after(self.dial_timeout):
                await send_preamble(stream, policy.manifest.id, b"")  # the announcer holds the manifest it named
        except _DIAL_ERRORS as exc:
            policy.failures[peer] = trio.current_time()
            log.debug("answering an announcement of %s failed: %s", peer, exc)
            return
        finally:
            policy.dialing.discard(peer)
        # serve_link registers the link before it first waits, so reconcile never sees this pair unlinked and idle;
        # the announcer opened it, not we: answered announcements must not fill the places we choose ourselves
        self._linked(policy, peer, dir="out", via="announcement")
        await policy.service.serve_link(peer, stream)

    async def _read_preamble(self, stream: Any, wait: float | None = None) -> Preamble | None:
        """The preamble of a data channel, None if it ends or stalls first (or another channel needed its place
        while it had not started); a manifest we hold is not buffered (swarm.policy.link_preamble).

        By default we wait as long as a dialer may keep a spare channel before using it."""
        wait = self.spare_ttl + self.transfer.handshake_timeout if wait is None else wait
        with trio.CancelScope() as idle:
            self._idle_waits[id(idle)] = idle
            try:
                head = await read_head(stream, wait)
            finally:
                self._idle_waits.pop(id(idle), None)
        if idle.cancelled_caught or head is None:
            return None
        return await read_body(stream, head, self.transfer.handshake_timeout, lambda route: route in self.policies,
                               self._preamble_rate)

    async def _adopted(self, manifest_id: bytes, wait: float) -> MirroredPolicy | None:
        with trio.move_on_after(wait):
            while manifest_id not in self.policies:
                await self.changed.wait()
        return self.policies.get(manifest_id)

    def is_mirrored(self, policy: MirroredPolicy) -> bool:
        """Whether `policy` is still mirrored: a newer version may have pushed it out of the window meanwhile, and
        a dropped version's service takes no more links."""
        return self.policies.get(policy.manifest.id) is policy and not (policy.scope and policy.scope.cancel_called)
