"""A running peer's parts and what it knows of the others: the state every task of the node shares.

The node's tasks (swarm.node.node, .gossip, .watchdogs, .reports, .metrics) take this state; it depends on none of
them, so the node's modules form no circle.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import trio

from p2p.dht.service import LatestManifest
from p2p.errors import P2PError
from p2p.identity import Identity
from p2p.pieces.manifest import PolicyManifest
from swarm.config import PeerConfig
from swarm.event_types import Generated, TrainStep, Validated
from swarm.events import Emitted, EventSink
from swarm.messages.gossip_bodies import ProgressValue
from swarm.node.announcement import announcement_body
from swarm.node.heartbeat_budget import MAX_KNOWN_PEERS, heartbeat_stretch, is_counted
from swarm.node.parts import run_part
from swarm.node.ports import DhtPort, GossipPort, HostPort
from swarm.policy.mirror import PolicyMirror
from swarm.policy.runspec import named_validators

log = logging.getLogger("swarm.node.node")
RoleTask = Callable[["Node"], Awaitable[None]]
DHT_PUT_LIMIT_S = 15.0  # larger manifests are announced by id and fetched by the manifest protocol
DHT_PUT_WARN_AFTER = 3
"""Versions in a row whose latest-manifest record the DHT did not store before that is worth a warning."""


@dataclass
class Node:
    """A running peer; role tasks receive it and use its parts."""

    config: PeerConfig
    host: HostPort
    gossip: GossipPort
    mirror: PolicyMirror
    events: EventSink
    nursery: trio.Nursery
    dht: DhtPort | None = None
    peer_roles: dict[str, tuple[str, ...]] = field(default_factory=dict)  # peer id -> roles from heartbeats
    peer_heard: dict[str, float] = field(default_factory=dict)  # peer id -> when its last heartbeat came (trio)
    counted_known: int = 0  # peers in peer_roles with a counted role (swarm.node.heartbeat_budget.COUNTED_ROLES)
    named: tuple[bytes | None, int] = (None, 0)  # newest manifest id -> counted peers it names (named_counted)
    done: trio.Event = field(default_factory=trio.Event)
    failed: bool = False
    dht_put_misses: int = 0  # latest-manifest puts in a row that did not complete
    # what its roles did (note_progress), carried by heartbeats for the status view
    progress: dict[str, ProgressValue] = field(default_factory=dict)
    fetching: set[bytes] = field(default_factory=set)  # manifest ids being fetched now (fetch_manifest_soon)

    @property
    def peer_id(self) -> str:
        return self.host.peer_id

    @property
    def identity(self) -> Identity:
        return self.host.identity

    def heard_from(self, peer: str, roles: tuple[str, ...], now: float) -> None:
        """A heartbeat from `peer` came at `now`: it is alive and plays `roles`. The tables stay in order of last
        heard and hold at most MAX_KNOWN_PEERS: the least recently heard goes first."""
        self._forget(peer)
        self.peer_heard[peer] = now
        self.peer_roles[peer] = roles
        self.counted_known += is_counted(roles)
        while len(self.peer_heard) > MAX_KNOWN_PEERS:
            self._forget(next(iter(self.peer_heard)))

    def _forget(self, peer: str) -> tuple[str, ...]:
        self.peer_heard.pop(peer, None)
        roles = self.peer_roles.pop(peer, None)
        self.counted_known -= roles is not None and is_counted(roles)
        return roles or ()

    def known_alike(self, counted: bool) -> int:
        """Known peers on the counted roles' heartbeat budget (`counted`) or on the others'."""
        return self.counted_known if counted else len(self.peer_heard) - self.counted_known

    def stretch(self, counted: bool) -> float:
        """How much the heartbeat period and silence of the counted roles (or the others) stretch here."""
        return heartbeat_stretch(self.known_alike(counted), counted, self.named_counted() if counted else 0)

    def named_counted(self) -> int:
        """Peers of the counted roles the newest version names: its validators and its trainer (0 before one)."""
        newest = self.mirror.latest()
        if newest is None:
            return 0
        if self.named[0] != newest.manifest.id:
            self.named = (newest.manifest.id, named_validators(newest.manifest.model) + 1)
        return self.named[1]

    def forget_silent(self, now: float) -> dict[str, tuple[str, ...]]:
        """Forget peers not heard from for `peer_silence_s` (stretched as their kind's heartbeats are); returns
        them with their roles. Why: a validator that left must drop out of the next version's validator set, or the
        rollouts assigned to it wait out the quorum timeout every version (all of them, with a quorum that large)."""
        silence = self.config.peer.peer_silence_s
        window = {counted: silence * self.stretch(counted) for counted in (True, False)}
        silent = []
        for peer, at in self.peer_heard.items():  # least recently heard first: stop at the first within both windows
            if now - at <= window[True] and now - at <= window[False]:
                break
            if now - at > window[is_counted(self.peer_roles.get(peer, ()))]:
                silent.append(peer)
        return {peer: self._forget(peer) for peer in silent}

    def note_progress(self, emitted: Emitted) -> None:
        """Keep the roles' latest milestones (an event listener) for heartbeats, so `swarm status` can show a
        trainer's step and reward, a worker's groups and a validator's verdicts without asking anyone."""
        event = emitted.event
        if isinstance(event, TrainStep):
            self.progress.update(step=event.step, reward=event.reward, stage=event.stage)
        elif isinstance(event, Generated):
            self.progress["groups_sent"] = self.progress.get("groups_sent", 0) + event.groups
            self.progress["answered"] = event.version
        elif isinstance(event, Validated):
            self.progress.update(checked=event.checked, accepted=event.accepted, rejected=event.rejected)

    def connected_peers(self) -> list[str]:
        return self.host.connected_peers()

    async def announce_policy(self, signed: bytes, manifest: PolicyManifest) -> None:
        """Tell the run about a new version: gossip (inline when small, by id otherwise) and the DHT record that
        names the run's latest manifest (signed by this peer, which must hold the trainer key)."""

        await self.gossip.publish("manifest", announcement_body(signed, manifest))
        record = LatestManifest.sign(self.config.peer.run, manifest.id, manifest.version, self.identity)
        # In the background: a DHT put waits on the slowest of its peers (10-17 s per version measured in the
        # simulation, a third of each step); the trainer must not wait for it before training on.
        self.nursery.start_soon(run_part, self, Node._put_latest, record)

    async def _put_latest(self, record: LatestManifest) -> None:
        miss = None
        try:
            with trio.move_on_after(DHT_PUT_LIMIT_S) as scope:
                await self.dht.put_latest_manifest(record)
            if scope.cancelled_caught:
                miss = f"not stored within {DHT_PUT_LIMIT_S:g} s"
        except P2PError as exc:
            miss = f"not stored: {exc}"
        self.note_dht_put(miss)

    def note_dht_put(self, miss: str | None) -> None:
        """Count a latest-manifest put that did not complete (`miss` says how), or reset on success.

        One miss is routine when the DHT's peers are slow: the DHT re-puts the record, and gossip and heartbeats
        carry the version meanwhile. A streak means late joiners cannot find the run's newest policy through the
        DHT, which is worth one warning per streak.
        """
        if miss is None:
            self.dht_put_misses = 0
            return
        self.dht_put_misses += 1
        level = logging.WARNING if self.dht_put_misses == DHT_PUT_WARN_AFTER else logging.DEBUG
        log.log(level, "latest-manifest record %s (%d versions in a row); the DHT re-puts it later", miss,
                self.dht_put_misses)
