"""Circuit relay v2 (py-libp2p's `libp2p.relay.circuit_v2`) wired into our host, with our limits.

Why py-libp2p's relay: its reservation (HOP RESERVE), circuit (HOP CONNECT / STOP CONNECT) and the upgrade of the
relayed byte stream into a Noise+Yamux connection work between our hosts (tests/test_reach*.py), and the circuit
multiaddr `/ip4/R/tcp/P/p2p/<relay>/p2p-circuit/p2p/<peer>` is the libp2p standard any peer can dial. What it lacks,
and this module adds: a bandwidth cap (it enforces reservations, circuits per peer, duration and bytes per circuit,
but not rate), a dial entry point our host's `connect` can use (its swarm drops /p2p-circuit addresses), and one
place that says which relays hold our reservation.
"""

from __future__ import annotations

import logging
import math
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import trio
from libp2p.peer.id import ID
from libp2p.relay.circuit_v2.config import RelayConfig, RelayRole
from libp2p.relay.circuit_v2.protocol import PROTOCOL_ID, STOP_PROTOCOL_ID, CircuitV2Protocol
from libp2p.relay.circuit_v2.resources import RelayLimits as Libp2pLimits
from libp2p.relay.circuit_v2.transport import CircuitV2Transport
from libp2p.tools.anyio_service import background_trio_service
from multiaddr import Multiaddr

from p2p.ratelimit import TokenBucket, acquire_all
from p2p.reach.relay_limits import RelayLimits, connection_kind, is_circuit

__all__ = ["RelayLimits", "Relaying", "connection_kind", "is_circuit", "open_relaying", "relay_protocol"]

log = logging.getLogger(__name__)


def _bucket(mbps: float) -> TokenBucket:
    rate = mbps * 1e6 / 8 if mbps else math.inf
    return TokenBucket(rate, burst=max(256 * 1024, rate / 8) if math.isfinite(rate) else None)


class _PacedStream:
    """A relay's destination stream whose writes wait for their bytes on the circuit's and the relay's buckets."""

    def __init__(self, stream: Any, buckets: list[TokenBucket]) -> None:
        self._stream = stream
        self._buckets = buckets

    async def write(self, data: bytes) -> None:
        await acquire_all(self._buckets, len(data))
        await self._stream.write(data)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


def relay_protocol(libp2p_host: Any, limits: RelayLimits, hop: bool) -> Any:
    """py-libp2p's CircuitV2Protocol with our limits; `hop`: serve as a relay (else only accept circuits)."""
    total = _bucket(limits.total_mbps)

    class PacedRelay(CircuitV2Protocol):
        """Relays data at most `circuit_mbps` per circuit and `total_mbps` in all."""

        async def _relay_data(self, src_stream: Any, dst_stream: Any, *args: Any, **kwargs: Any) -> None:
            paced = _PacedStream(dst_stream, [_bucket(limits.circuit_mbps), total])
            await super()._relay_data(src_stream, paced, *args, **kwargs)

    libp2p_limits = Libp2pLimits(duration=limits.circuit_duration_s, data=limits.circuit_mb << 20,
                                 max_circuit_conns=limits.max_circuits_per_peer,
                                 max_reservations=limits.max_reservations)
    return PacedRelay(libp2p_host, limits=libp2p_limits, allow_hop=hop)


@dataclass
class Relaying:
    """The relay protocol and transport of one host, and the reservations it holds."""

    protocol: Any
    transport: Any
    reservations: dict[str, str] = field(default_factory=dict)
    """Relay peer id -> the relay's multiaddr (with /p2p/<relay>) through which this peer is reachable."""

    async def reserve(self, relay_addr: str, relay_peer: str, nursery: trio.Nursery, timeout: float) -> bool:
        """Ask `relay_peer` (already connected) for a reservation; True when it granted one."""
        peer = ID.from_base58(relay_peer)
        with trio.move_on_after(timeout):
            try:
                stream = await self.protocol.host.new_stream(peer, [PROTOCOL_ID])
                granted = await self.transport.reserve(stream, peer, nursery)
            except Exception as exc:  # noqa: BLE001 - a peer that is no relay: one debug line, try the next
                log.debug("no reservation on %s: %s", relay_peer, exc)
                return False
            if granted:
                self.reservations[relay_peer] = relay_addr
            return bool(granted)
        return False

    async def dial(self, circuit_addr: str) -> None:
        """Connect through a relay: `circuit_addr` is /.../p2p/<relay>/p2p-circuit/p2p/<peer>."""
        await self.transport.dial(Multiaddr(circuit_addr))


@asynccontextmanager
async def open_relaying(host: Any, limits: RelayLimits, hop: bool) -> AsyncIterator[Relaying]:
    """The relay protocol (hop: serving others) and the circuit transport (dialing and accepting circuits) of our
    `host` (p2p.host.p2p_host.P2PHost), running until the context exits. Its handlers are re-installed guarded: an
    exception escaping one would kill the host."""
    protocol = relay_protocol(host.libp2p, limits, hop)
    roles = RelayRole.STOP | RelayRole.CLIENT | (RelayRole.HOP if hop else RelayRole(0))
    config = RelayConfig(roles=roles, limits=protocol.limits)
    async with background_trio_service(protocol):
        await protocol.event_started.wait()
        transport = CircuitV2Transport(host.libp2p, protocol, config)
        host.set_guarded_handler(STOP_PROTOCOL_ID, protocol._handle_stop_stream, timeout=None)
        if hop:
            host.set_guarded_handler(PROTOCOL_ID, protocol._handle_hop_stream, timeout=None)
        yield Relaying(protocol, transport)
