"""What a role task may use of its peer: a typed context instead of the whole node.

Why: a role that receives the node can reach anything in it (its nursery, its DHT, its peer bookkeeping), so what
a role depends on is only known by reading all of it, and a test fake must guess. The context names each part by
the narrow port the role uses: its configuration, the identity it signs with, the host and gossip (for rollouts
and votes), the mirror's side it reads and the trainer's adoption of its own versions, the event sink, the table
of peers and their roles heard in heartbeats, and the event that stops the peer.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import trio

from p2p.identity import Identity
from p2p.pieces.manifest import PolicyManifest
from p2p.pieces.store import PieceStore
from swarm.config import PeerConfig
from swarm.node.ports import EventPort, GossipPort, HostPort
from swarm.node.state import Node, RoleTask
from swarm.policy.mirrored import MirroredPolicy


class MirrorView(Protocol):
    """The mirror's side a role uses (swarm.policy.mirror.PolicyMirror): the versions held, a wake-up when they
    change, their files while a worker thread reads them, and the trainer's adoption of the versions it publishes."""

    policies: dict[bytes, MirroredPolicy]
    store: PieceStore
    changed: trio.Event  # set, and replaced, whenever a version is adopted or completes

    def copy_dir(self, policy: MirroredPolicy) -> Path: ...

    def latest(self) -> MirroredPolicy | None: ...

    def complete_versions(self) -> list[MirroredPolicy]: ...

    def is_mirrored(self, policy: MirroredPolicy) -> bool: ...

    def holding(self, policy: MirroredPolicy) -> AbstractContextManager[None]: ...

    def adopt(self, signed: bytes, local_dir: Path | None = None) -> MirroredPolicy | None: ...


@dataclass(frozen=True)
class RoleContext:
    """One role's view of its peer; every field is shared with the node, so it is live, not a snapshot."""

    config: PeerConfig  # the peer's configuration: a role reads its own section and the peer's
    identity: Identity  # the key its votes, rollouts and (the trainer's) manifests are signed with
    host: HostPort  # streams to other peers (rollout blobs fetched by hash)
    gossip: GossipPort  # the run's topics: rollouts, votes, manifests
    mirror: MirrorView  # the policy versions this peer holds
    events: EventPort  # what the role reports
    peer_roles: Mapping[str, tuple[str, ...]]  # peer id -> the roles its last heartbeat named
    done: trio.Event  # set to stop the peer (a trainer that trained, `exit_when_trained`)
    announce_policy: Callable[[bytes, PolicyManifest], Awaitable[None]]  # gossip and the DHT record of a new version

    @property
    def peer_id(self) -> str:
        return self.host.peer_id


def role_context(node: Node) -> RoleContext:
    """The context of a role task run by `node`."""
    return RoleContext(config=node.config, identity=node.identity, host=node.host, gossip=node.gossip,
                       mirror=node.mirror, events=node.events, peer_roles=node.peer_roles, done=node.done,
                       announce_policy=node.announce_policy)


Role = Callable[[RoleContext], Awaitable[None]]


def role_part(role: Role) -> RoleTask:
    """`role` as one of a node's tasks, given its context; named as the role is, for the report of a failure
    (swarm.node.parts.run_part)."""

    async def part(node: Node) -> None:
        await role(role_context(node))

    part.__name__ = getattr(role, "__name__", "role")
    return part

