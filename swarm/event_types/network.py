"""Events of a peer's network side: its host and bootstrap links, the peers it hears, its metrics endpoint, and the
watchdogs that end it (swarm.node)."""

from __future__ import annotations

from dataclasses import dataclass

from swarm.event_types.base import Event


@dataclass(frozen=True, kw_only=True)
class Listening(Event):
    """The host is up: where other peers reach it."""

    kind = "listening"
    peer_id: str  # this peer's libp2p id
    addrs: list[str]  # its listen multiaddrs, each ending in /p2p/<peer_id>
    roles: list[str]  # the roles it plays

    def line(self) -> str:
        addrs = "\n  ".join(self.addrs)
        return f"peer {self.peer_id} ({', '.join(self.roles)}) listening on\n  {addrs}"


@dataclass(frozen=True, kw_only=True)
class BootstrapUnreachable(Event):
    """A configured bootstrap address could not be resolved or dialed at start."""

    kind = "bootstrap_unreachable"
    address: str  # the address as configured
    reason: str  # why, naming the address

    def line(self) -> str:
        return f"warning: bootstrap peer unreachable: {self.reason or self.address}"


@dataclass(frozen=True, kw_only=True)
class BootstrapReconnected(Event):
    """A bootstrap peer answered again after the peer had lost every bootstrap link."""

    kind = "bootstrap_reconnected"
    address: str  # the bootstrap address that answered
    message: str  # the line a person reads


@dataclass(frozen=True, kw_only=True)
class BootstrapRetry(Event):
    """No bootstrap peer answered yet; the next try comes after `delay_s`."""

    kind = "bootstrap_retry"
    attempt: int  # tries so far
    delay_s: float  # seconds until the next try
    message: str  # what failed and for how long

    def line(self) -> str:
        return f"warning: {self.message}"


@dataclass(frozen=True, kw_only=True)
class BootstrapGaveUp(Event):
    """No bootstrap peer answered within the configured wait: the peer stops (swarm.node.watchdogs)."""

    kind = "bootstrap_gave_up"
    message: str  # what was tried, and what a user can do

    def line(self) -> str:
        return f"error: {self.message}"


@dataclass(frozen=True, kw_only=True)
class TrainerKeyGaveUp(Event):
    """No version signed by the trainer key arrived in time: the peer stops (swarm.node.watchdogs)."""

    kind = "trainer_key_gave_up"
    message: str  # which key was waited for, and what a user can do

    def line(self) -> str:
        return f"error: {self.message}"


@dataclass(frozen=True, kw_only=True)
class PeerGone(Event):
    """A peer sent no heartbeat within its silence window: its roles no longer count."""

    kind = "peer_gone"
    peer: str  # its libp2p id
    roles: list[str]  # the roles its last heartbeat named
    message: str  # the line a person reads


@dataclass(frozen=True, kw_only=True)
class RoleFailed(Event):
    """A role task raised: the peer stops with a failure (swarm.node.parts.run_part)."""

    kind = "role_failed"
    role: str  # the role's name
    message: str  # the error, one sentence

    def line(self) -> str:
        return f"{self.role} FAILED: {self.message}"


@dataclass(frozen=True, kw_only=True)
class MetricsListening(Event):
    """The Prometheus endpoint is serving."""

    kind = "metrics_listening"
    url: str  # where to scrape
    message: str  # the line a person reads


@dataclass(frozen=True, kw_only=True)
class Warned(Event):
    """Something a user may want to know that changes nothing (a DHT lookup that failed)."""

    kind = "warning"
    message: str  # what happened


@dataclass(frozen=True, kw_only=True)
class Stalled(Event):
    """A simulation's trainer has not stepped for `seconds`: what this peer holds and did last (swarm.sim.run)."""

    kind = "stalled"
    seconds: float  # the watchdog's period
    last: str  # this peer's latest milestone, and how long ago
    knows: int | None  # the newest version it knows, None before any
    holds: int | None  # the newest version it holds complete, None before any
    connected: int  # peers it is connected to
    stopped: bool  # whether the peer has stopped


@dataclass(frozen=True, kw_only=True)
class Finished(Event):
    """A build-bench peer holds the newest version complete and stops (swarm.roles.build)."""

    kind = "finished"
    version: int  # the version it holds
    max_rss_mb: float  # its peak resident memory
    down_from: dict[str, int]  # bytes downloaded, by peer
    up_to: dict[str, int]  # bytes uploaded, by peer


@dataclass(frozen=True, kw_only=True)
class GossipStats(Event):
    """A bench peer's gossip counters, when they changed (swarm.bench.scale.report_gossip)."""

    kind = "gossip_stats"
    delivered: int  # messages delivered to this peer's handlers
    published: int  # messages this peer published
    peers_known: int  # peers in its heartbeat table
    connected: int  # peers it is connected to
    mesh: float  # mean mesh size over its topics


@dataclass(frozen=True, kw_only=True)
class ChatterFailed(Event):
    """A bench peer's chatter message could not be published."""

    kind = "chatter_failed"
    error: str  # why
