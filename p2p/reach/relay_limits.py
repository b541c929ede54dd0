"""What a public peer grants private ones when it serves as a relay, and how a relayed address or connection is
told: plain settings and string checks, no networking (a config imports them without loading libp2p)."""

from __future__ import annotations

import ipaddress
import math
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from p2p.errors import HostError


@dataclass(frozen=True)
class RelayLimits:
    """What this peer grants others when it serves as a relay (only when it is publicly reachable)."""

    serve: bool = True
    """Serve as a relay when this peer is publicly reachable (a private peer never does)."""
    max_reservations: int = 32
    """Private peers that may hold a reservation (a relayed address) on this relay at once, whatever their ids."""
    max_reservations_per_ip: int = 8
    """Reservations held by peers connecting from one IP (go-libp2p's default): ids are free, addresses less so."""
    max_circuits_per_peer: int = 16
    """Relayed connections open at once to one reserved peer, and from one peer."""
    max_circuits: int = 64
    """Relayed connections open at once through this relay, whatever the peers at their ends."""
    circuits_per_s: float = 4.0
    """Relayed connections this relay opens per second (bursts of four times as many): each costs a stream to the
    destination and its handshakes."""
    circuit_duration_s: int = 3600
    """A relayed connection is cut after this long (hole punching usually replaces it within seconds)."""
    circuit_mb: int = 4096
    """Bytes (MiB) one relayed connection may carry, both directions together, before it is cut."""
    circuit_mbps: float = 16.0
    """Bandwidth cap of one relayed connection in each direction, Mbit/s (0: none)."""
    total_mbps: float = 24.0
    """Bandwidth cap of all relayed connections of this relay together, both directions, Mbit/s (0: none). Each
    relayed MiB/s costs the relay about 3 % of a core (decrypting and re-encrypting both legs): 24 Mbit/s keeps
    relaying under a tenth of a core, whoever asks; bulk data between private peers goes by hole punching."""

    def __post_init__(self) -> None:
        if min(self.max_reservations, self.max_reservations_per_ip, self.max_circuits_per_peer, self.max_circuits,
               self.circuit_duration_s, self.circuit_mb) < 1 or self.circuits_per_s <= 0:
            raise HostError("relay limits (reservations, circuits, duration, MiB) must be at least 1, the circuit "
                            "rate positive")
        if self.circuit_mbps < 0 or self.total_mbps < 0:
            raise HostError("relay bandwidth caps must be 0 (none) or positive")

    @property
    def circuit_bytes_per_s(self) -> float:
        """The per-circuit cap in bytes per second (inf without one): what a Kumar-Ross bound over relays uses."""
        return self.circuit_mbps * 1e6 / 8 if self.circuit_mbps else math.inf


def ip_group(ip: str) -> str:
    """The address block one party holds for the cost of one: the IPv4 address itself, the /64 of an IPv6 one (a
    host gets a whole /64 and picks any address in it). What is not an IP is its own group."""
    try:
        parsed = ipaddress.ip_address(ip)
    except ValueError:
        return ip
    if isinstance(parsed, ipaddress.IPv6Address):
        if parsed.ipv4_mapped is not None:
            return str(parsed.ipv4_mapped)
        return str(ipaddress.ip_network(f"{parsed}/64", strict=False))
    return str(parsed)


def is_circuit(multiaddr: str) -> bool:
    """Whether a multiaddr goes through a relay."""
    return "/p2p-circuit" in multiaddr


class Connection(Protocol):
    """A libp2p connection as `connection_kind` reads it: py-libp2p's INetConn, or a stream's IMuxedConn."""

    def get_transport_addresses(self) -> Sequence[object]: ...


def connection_kind(conn: Connection) -> str:
    """"relayed" for a connection through a relay, else "direct", worked out once per connection.

    Why once: a connection's kind is fixed when it opens, and the reach service asks for every connection each
    second; formatting each connection's multiaddrs to ask again cost an idle peer about 1 % of a core at 16 peers,
    growing with its connections."""
    try:
        return _KINDS[conn]
    except (KeyError, TypeError):  # not seen yet, or an object that takes no weak reference: work it out
        pass
    try:
        addrs = conn.get_transport_addresses()
    except Exception:  # noqa: BLE001 - a connection closing under us: call it direct, it is not relayed anymore
        return "direct"
    kind = "relayed" if any(is_circuit(str(a)) for a in addrs or ()) else "direct"
    if addrs:  # a connection that shows no address yet is asked again
        try:
            _KINDS[conn] = kind
        except TypeError:
            pass
    return kind


_KINDS: weakref.WeakKeyDictionary[Connection, str] = weakref.WeakKeyDictionary()
"""connection -> its kind, for as long as the connection object lives."""


def kind_settled(conn: Connection) -> bool:
    """Whether `connection_kind` worked out `conn`'s kind for good (it had addresses to judge by)."""
    try:
        return conn in _KINDS
    except TypeError:
        return False
