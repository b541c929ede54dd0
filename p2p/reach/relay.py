"""Circuit relay v2 (py-libp2p's `libp2p.relay.circuit_v2`) wired into our host, with our limits.

Why py-libp2p's relay: its reservation (HOP RESERVE), circuit (HOP CONNECT / STOP CONNECT) and the upgrade of the
relayed byte stream into a Noise+Yamux connection work between our hosts (tests/p2p/test_reach*.py), and the circuit
multiaddr `/ip4/R/tcp/P/p2p/<relay>/p2p-circuit/p2p/<peer>` is the libp2p standard any peer can dial. What it lacks,
and this module adds: p2p.reach.relay_guard's node-wide bounds on reservations and circuits (and the release of a
reservation whose holder left), a bandwidth cap (it enforces duration and bytes per circuit, but not rate), a dial
entry point our host's `connect` can use (its swarm drops /p2p-circuit addresses), and one place that says which
relays hold our reservation.
"""

from __future__ import annotations

import logging
import math
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import trio
from libp2p.abc import IHost, INetStream
from libp2p.peer.id import ID
from libp2p.relay.circuit_v2.config import RelayConfig, RelayRole
from libp2p.relay.circuit_v2.pb.circuit_pb2 import HopMessage
from libp2p.relay.circuit_v2.protocol import PROTOCOL_ID, STOP_PROTOCOL_ID, CircuitV2Protocol
from libp2p.relay.circuit_v2.protocol_buffer import StatusCode
from libp2p.relay.circuit_v2.resources import RelayLimits as Libp2pLimits
from libp2p.relay.circuit_v2.transport import CircuitV2Transport
from libp2p.tools.anyio_service import background_trio_service
from multiaddr import Multiaddr

from p2p.ratelimit import TokenBucket, acquire_all
from p2p.reach.host_view import ReachHost
from p2p.reach.relay_guard import CircuitAcceptor, RelayGuard
from p2p.reach.relay_limits import RelayLimits, connection_kind, is_circuit
from p2p.stream_guard import reset_quietly

__all__ = ["GuardedRelay", "RelayLimits", "Relaying", "connection_kind", "is_circuit", "open_relaying",
           "relay_protocol"]

log = logging.getLogger(__name__)
SWEEP_EVERY_S = 1.0
"""How often the reservations of holders that left are looked for."""


def _bucket(mbps: float) -> TokenBucket:
    rate = mbps * 1e6 / 8 if mbps else math.inf
    return TokenBucket(rate, burst=max(256 * 1024, rate / 8) if math.isfinite(rate) else None)


class _PacedStream:
    """A relay's destination stream whose writes wait for their bytes on the circuit's and the relay's buckets."""

    def __init__(self, stream: INetStream, buckets: list[TokenBucket]) -> None:
        self._stream = stream
        self._buckets = buckets

    async def write(self, data: bytes) -> None:
        await acquire_all(self._buckets, len(data))
        await self._stream.write(data)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


def _remote_ip(stream: INetStream) -> str:
    """The IP a stream's connection comes from ("" when unknown: all such count as one address)."""
    try:
        remote = stream.get_remote_address()
    except Exception:  # noqa: BLE001 - a connection closing under us
        return ""
    return str(remote[0]) if remote else ""


class _Unfiled:
    """A circuit end's peer id as py-libp2p's table of circuits (and of reservations) never finds it; it prints as
    the id in py-libp2p's log lines."""

    def __init__(self, peer_id: ID) -> None:
        self.peer_id = peer_id

    def __str__(self) -> str:
        return str(self.peer_id)


class GuardedRelay(CircuitV2Protocol):
    """py-libp2p's relay within p2p.reach.relay_guard's bounds, relaying at most `circuit_mbps` per circuit and
    `total_mbps` in all."""

    def __init__(self, libp2p_host: IHost, limits: RelayLimits, hop: bool) -> None:
        libp2p_limits = Libp2pLimits(duration=limits.circuit_duration_s, data=limits.circuit_mb << 20,
                                     max_circuit_conns=limits.max_circuits_per_peer,
                                     max_reservations=limits.max_reservations)
        super().__init__(libp2p_host, limits=libp2p_limits, allow_hop=hop)
        self.guard = RelayGuard(limits)
        self._circuit_mbps = limits.circuit_mbps
        self._total = _bucket(limits.total_mbps)
        self._directions: dict[frozenset[int], list[trio.CancelScope]] = {}
        """The directions under way of each circuit (its two streams' ids): one ending ends the other."""

    async def _handle_reserve(self, stream: INetStream, msg: HopMessage) -> None:
        """A reservation for the peer that asks (never one its message names), within the guard's caps."""
        msg.ClearField("peer")
        if not self.guard.admit_reservation(str(stream.muxed_conn.peer_id), _remote_ip(stream)):
            await self._send_status(stream, StatusCode.RESOURCE_LIMIT_EXCEEDED, "reservation limit")
            return
        await super()._handle_reserve(stream, msg)

    async def _handle_connect(self, stream: INetStream, msg: HopMessage) -> None:
        """A circuit within the guard's caps, counted from the request until it ends (py-libp2p's handler returns
        when the circuit closes)."""
        if not self._reserved(bytes(msg.peer.id)):  # py-libp2p refuses it: no place or rate spent on it
            await super()._handle_connect(stream, msg)
            return
        ends = str(stream.muxed_conn.peer_id), _remote_ip(stream), bytes(msg.peer.id).hex()
        if not self.guard.open_circuit(*ends, trio.current_time()):
            await self._send_status(stream, StatusCode.RESOURCE_LIMIT_EXCEEDED, "circuit limit")
            await stream.reset()
            return
        try:
            await super()._handle_connect(stream, msg)
        finally:
            self.guard.close_circuit(*ends)
            self._forget_streams(stream, [stream.muxed_conn.peer_id, ID(bytes(msg.peer.id))])

    def _forget_streams(self, stream: INetStream, peers: list[ID]) -> None:
        """Drop what py-libp2p's table of relayed streams still holds of a circuit that ended: it keeps the source's
        entry of a circuit that failed to open for good, one per source id, and ids are free."""
        for peer in peers:
            held = self._active_relays.get(peer)
            if held is not None and held[0] is stream:
                del self._active_relays[peer]

    def _reserved(self, peer_id: bytes) -> bool:
        """Whether `peer_id` (as a CONNECT names it) holds a reservation here that can take a circuit."""
        try:
            return self.resource_manager.can_accept_connection(ID(peer_id))
        except Exception:  # noqa: BLE001 - bytes that are no peer id: nobody holds a reservation under them
            return False

    async def _relay_data(self, src_stream: INetStream, dst_stream: INetStream, peer_id: ID, *args: Any,
                          **kwargs: Any) -> None:
        """One direction of a circuit; when it ends, so does the circuit (both streams reset), and no other. Why:
        py-libp2p would go on reading the other direction from an end with nothing to say, and the circuit kept its
        place for good after its source left; and on its end it closes the streams filed under `peer_id` in its
        table of circuits, one entry per id, which are those of the last circuit filed under that id: ending one
        circuit cut another with the same destination or source, so a crowd opening and closing circuits to a peer
        cut every honest circuit to it. Its cleanup is handed an id it never finds; ours resets this circuit's
        streams and `_forget_streams` its entries."""
        paced = _PacedStream(dst_stream, [_bucket(self._circuit_mbps), self._total])
        circuit = frozenset((id(src_stream), id(dst_stream)))  # both directions of one circuit share it
        directions = self._directions.setdefault(circuit, [])
        with trio.CancelScope() as scope:
            directions.append(scope)
            try:
                await super()._relay_data(src_stream, paced, _Unfiled(peer_id), *args, **kwargs)
            finally:
                for direction in directions:
                    direction.cancel()
        directions.remove(scope)
        if not directions:
            del self._directions[circuit]
        await reset_quietly(src_stream)
        await reset_quietly(dst_stream)

    def drop_departed(self, now: float) -> list[str]:
        """Drop the reservations whose holders left RESERVATION_GRACE_S ago (p2p.reach.relay_guard.sweep)."""
        table = self.resource_manager._reservations
        connections = self.host.get_network().connections
        present = {str(peer) for peer, held in table.items() if not held.is_expired() and connections.get(peer)}
        gone = self.guard.sweep(present, now)
        for peer in gone:
            table.pop(ID.from_base58(peer), None)
        return gone


def relay_protocol(libp2p_host: IHost, limits: RelayLimits, hop: bool) -> GuardedRelay:
    """py-libp2p's CircuitV2Protocol with our limits; `hop`: serve as a relay (else only accept circuits)."""
    return GuardedRelay(libp2p_host, limits, hop)


async def _drop_departed(protocol: GuardedRelay) -> None:
    while True:
        for peer in protocol.drop_departed(trio.current_time()):
            log.debug("relay reservation of %s dropped: it left", peer)
        await trio.sleep(SWEEP_EVERY_S)


@dataclass
class Relaying:
    """The relay protocol and transport of one host, and the reservations it holds."""

    protocol: GuardedRelay
    transport: CircuitV2Transport
    reservations: dict[str, str] = field(default_factory=dict)
    """Relay peer id -> the relay's multiaddr (with /p2p/<relay>) through which this peer is reachable."""
    acceptor: CircuitAcceptor = field(default_factory=CircuitAcceptor)
    """Which relayed connections to us are accepted."""

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

    async def accept_circuit(self, stream: INetStream) -> None:
        """A relay's STOP stream: a relayed connection to us, accepted within p2p.reach.relay_guard.CircuitAcceptor;
        else reset."""
        if not self.acceptor.accept(str(stream.muxed_conn.peer_id), self.reservations, trio.current_time()):
            await reset_quietly(stream)
            return
        await self.protocol._handle_stop_stream(stream)

    async def dial(self, circuit_addr: str) -> None:
        """Connect through a relay: `circuit_addr` is /.../p2p/<relay>/p2p-circuit/p2p/<peer>."""
        await self.transport.dial(Multiaddr(circuit_addr))


@asynccontextmanager
async def open_relaying(host: ReachHost, limits: RelayLimits, hop: bool) -> AsyncIterator[Relaying]:
    """The relay protocol (hop: serving others) and the circuit transport (dialing and accepting circuits) of our
    `host` (p2p.host.p2p_host.P2PHost), running until the context exits. Its handlers are re-installed guarded: an
    exception escaping one would kill the host."""
    protocol = relay_protocol(host.libp2p, limits, hop)
    roles = RelayRole.STOP | RelayRole.CLIENT | (RelayRole.HOP if hop else RelayRole(0))
    config = RelayConfig(roles=roles, limits=protocol.limits)
    async with background_trio_service(protocol), trio.open_nursery() as nursery:
        await protocol.event_started.wait()
        relaying = Relaying(protocol, CircuitV2Transport(host.libp2p, protocol, config))
        host.set_guarded_handler(STOP_PROTOCOL_ID, relaying.accept_circuit, timeout=None)
        if hop:
            host.set_guarded_handler(PROTOCOL_ID, protocol._handle_hop_stream, timeout=None)
            nursery.start_soon(_drop_departed, protocol)
        try:
            yield relaying
        finally:
            nursery.cancel_scope.cancel()
