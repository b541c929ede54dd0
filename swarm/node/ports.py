"""The narrow views of a peer's networking that the rest of swarm/ uses: its host, its gossip and its DHT; and the
sink its events go to.

Why Protocols instead of the concrete classes of p2p/: a role or a message transport needs a handful of calls (open
a stream, publish a body, look up a record), and naming exactly those keeps each of them testable with a small
fake, keeps p2p/'s internals (libp2p objects, the pubsub router) out of swarm/, and shows at a glance what a part
of the peer can do to the network.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Protocol

import trio

from p2p.dht.service import LatestManifest, Provider
from p2p.gossip.envelope import Envelope
from p2p.gossip.parts import GossipStats
from p2p.identity import Identity
from swarm.event_types import Event

GossipBody = Mapping[str, object] | bytes
"""What a gossip message carries before it is sealed: a map of plain msgpack values, or bytes (p2p.gossip.envelope)."""


class HostStream(Protocol):
    """A stream the host opened or accepted (py-libp2p's), as swarm/ uses it: bytes out and in, then closed."""

    async def read(self, n: int | None = None) -> bytes: ...

    async def write(self, data: bytes) -> None: ...

    async def close(self) -> None: ...

    async def reset(self) -> None: ...


StreamHandler = Callable[[HostStream], Awaitable[None]]


class HostPort(Protocol):
    """What swarm/ asks of a libp2p host (p2p.host.p2p_host.P2PHost)."""

    identity: Identity
    bootstrap_failures: dict[str, str]
    fault_listeners: list[Callable[[str, str], None]]

    @property
    def peer_id(self) -> str: ...

    @property
    def multiaddrs(self) -> list[str]: ...

    def connected_peers(self) -> list[str]: ...

    def connection_counts(self) -> dict[str, int]: ...

    async def connect(self, multiaddr: str) -> str: ...

    async def redial(self, multiaddr: str) -> str: ...

    async def new_stream(self, peer_id: str, protocol: str) -> HostStream: ...

    def set_guarded_handler(self, protocol: str, handler: StreamHandler, timeout: float | None = ..., *,
                            idle_streams: bool = False) -> None: ...

    def remote_peer_id(self, stream: HostStream) -> str: ...

    def peers_in_use(self) -> set[str]: ...

    async def disconnect(self, peer: str) -> None: ...


class GossipPort(Protocol):
    """What swarm/ asks of the run's gossip (p2p.gossip.service.Gossip): signed, typed bodies by kind."""

    stats: GossipStats

    async def publish(self, kind: str, body: GossipBody) -> Envelope: ...

    def subscribe(self, kind: str) -> trio.MemoryReceiveChannel[Envelope]: ...

    async def serve(self, kind: str, handle: Callable[[Envelope], Awaitable[None] | None]) -> None: ...

    def penalize(self, peer: str, reason: str) -> None: ...

    def banned_peers(self) -> list[str]: ...

    def mesh_peers(self) -> set[str]: ...

    async def wait_for_mesh(self, peer_id: str, kind: str, timeout: float = 10.0) -> None: ...


class DhtPort(Protocol):
    """What swarm/ asks of the Kademlia DHT (p2p.dht.service.DHT): who holds a version, and the run's newest
    manifest."""

    async def provide(self, key: bytes) -> bool: ...

    def unprovide(self, key: bytes) -> None: ...

    async def find_providers(self, key: bytes) -> list[Provider]: ...

    async def put_latest_manifest(self, record: LatestManifest) -> None: ...

    async def get_latest_manifest(self, run: str, trainer_key: bytes) -> LatestManifest | None: ...


class PeerNetwork(Protocol):
    """A peer's host and gossip together: what a message transport needs (swarm.messages.rollout_transport)."""

    host: HostPort
    gossip: GossipPort


class EventPort(Protocol):
    """Where a part of the peer says what it did (swarm.events.EventSink)."""

    def emit(self, event: Event, t: float | None = None) -> None: ...
