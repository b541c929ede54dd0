"""Fuzz targets for what strangers send the reachability service: a DCUtR CONNECT message (the addresses a hole
punch would dial) and a relay HOP request (what the relay's guard is asked to grant). Each decodes the protobuf the
way py-libp2p reads it (4 KiB at most for DCUtR), then takes the decision our code makes from it; both must end in
a value or a protobuf DecodeError, never another exception."""

from __future__ import annotations

import functools

from google.protobuf.message import DecodeError
from libp2p.relay.circuit_v2.pb.circuit_pb2 import HopMessage
from libp2p.relay.circuit_v2.pb.dcutr_pb2 import HolePunch
from multiaddr import Multiaddr

from p2p.reach.punch_guard import PunchGuard
from p2p.reach.punching import GuardedDCUtR
from p2p.reach.relay_guard import RelayGuard
from p2p.reach.relay_limits import RelayLimits

DCUTR_MAX_MESSAGE = 4096
"""py-libp2p's read limit on a DCUtR message (libp2p.relay.circuit_v2.dcutr.MAX_MESSAGE_SIZE)."""
ERRORS = (DecodeError,)


def decode_punch_connect(data: bytes) -> list[str]:
    """The addresses a session admits from a peer's CONNECT message."""
    if len(data) > DCUTR_MAX_MESSAGE:
        raise DecodeError("a DCUtR message is 4 KiB at most")
    message = HolePunch()
    message.ParseFromString(data)
    addrs = GuardedDCUtR._decode_observed_addrs(object.__new__(GuardedDCUtR), list(message.ObsAddrs))
    guard = PunchGuard()
    guard.may_start("stranger", 0.0)
    return guard.admit("stranger", [str(a) for a in addrs], 0.0)


@functools.cache
def punch_connect_samples() -> list[bytes]:
    addrs = ["/ip4/198.51.100.7/tcp/4001", "/ip6/2001:db8::7/tcp/4001", "/ip4/198.51.100.7/udp/4001/quic-v1"]
    return [HolePunch(type=HolePunch.CONNECT, ObsAddrs=[Multiaddr(a).to_bytes() for a in addrs[:n]])
            .SerializeToString() for n in (0, 1, 3)]


def decode_hop_request(data: bytes) -> bool:
    """What the relay's guard grants a HOP request: a reservation for the asker, or a circuit to the named peer."""
    message = HopMessage()
    message.ParseFromString(data)
    guard = RelayGuard(RelayLimits())
    if message.type == HopMessage.RESERVE:
        message.ClearField("peer")
        return guard.admit_reservation("asker", "198.51.100.7")
    return guard.open_circuit("asker", "198.51.100.7", bytes(message.peer.id).hex(), 0.0)


@functools.cache
def hop_request_samples() -> list[bytes]:
    reserve = HopMessage(type=HopMessage.RESERVE)
    connect = HopMessage(type=HopMessage.CONNECT)
    connect.peer.id = bytes(range(34))
    return [reserve.SerializeToString(), connect.SerializeToString()]
