"""What a role task may use of its peer: a typed context instead of the whole node.

Why: a role that receives the node can reach anything in it (its nursery, its DHT, its peer bookkeeping), so what
a role depends on is only known by reading all of it, and a test fake must guess. The context names each part by
the narrow port the role uses: the [peer] section every role shares and the role's own settings (never the whole
configuration), the identity it signs with, the host and gossip (for rollouts and votes), the mirror's side it
reads and the trainer's adoption of its own versions, the event sink, the table of peers and their roles heard in
heartbeats, and the event that stops the peer.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Generic, TypeVar

import trio

from p2p.identity import Identity
from p2p.pieces.manifest import PolicyManifest
from swarm.config import PeerConfig, PeerSection
from swarm.node.ports import EventPort, GossipPort, HostPort
from swarm.node.state import Node, RoleTask
from swarm.policy.mirror_view import MirrorView

Settings = TypeVar("Settings")


@dataclass(frozen=True)
class RoleContext(Generic[Settings]):
    """One role's view of its peer; every field is shared with the node, so it is live, not a snapshot."""

    peer: PeerSection  # what every role shares: the run, the base model, the device, the data directory
    settings: Settings  # the role's own settings (its config section), as `role_part` was told to select them
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


def role_context(node: Node, settings: Settings) -> RoleContext[Settings]:
    """The context of a role task run by `node`, with the role's own `settings`."""
    return RoleContext(peer=node.config.peer, settings=settings, identity=node.identity, host=node.host,
                       gossip=node.gossip, mirror=node.mirror, events=node.events, peer_roles=node.peer_roles,
                       done=node.done, announce_policy=node.announce_policy)


def role_part(role: Callable[[RoleContext[Settings]], Awaitable[None]],
              settings: Callable[[PeerConfig], Settings]) -> RoleTask:
    """`role` as one of a node's tasks, given its context with the settings `settings` selects of the peer's
    configuration; named as the role is, for the report of a failure (swarm.node.parts.run_part)."""

    async def part(node: Node) -> None:
        await role(role_context(node, settings(node.config)))

    part.__name__ = getattr(role, "__name__", "role")
    return part

