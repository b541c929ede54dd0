"""Where data sockets listen and come from: the IP helpers of p2p.channel.service's listener."""

from __future__ import annotations

import ipaddress
import math

import trio

from p2p.channel.host_view import ChannelHost
from p2p.errors import HostError


def remote_ip(sock: trio.SocketStream) -> str:
    """The IP a data socket comes from; "?" when it cannot be told (counted as one stranger)."""
    try:
        return str(sock.socket.getpeername()[0])
    except (OSError, AttributeError, IndexError):  # already reset, or not an IP socket: one shared place
        return "?"


def is_loopback(ip: str) -> bool:
    """Whether `ip` is 127.0.0.0/8 or ::1 (a scope suffix ignored)."""
    try:
        return ipaddress.ip_address(ip.split("%")[0]).is_loopback
    except ValueError:  # "?" (a socket already reset): counted as a stranger
        return False


def listen_ip(multiaddrs: list[str]) -> str:
    """The IP of the first ip4/ip6 listen address: the data socket listens beside libp2p."""
    for addr in multiaddrs:
        parts = addr.split("/")
        if len(parts) > 2 and parts[1] in ("ip4", "ip6"):
            return parts[2]
    raise HostError("the host has no IP listen address to put a data socket on")


UNREACHABLE_FOR_S = 60.0
"""How long a peer whose data socket could not be reached is not tried again: a private peer that dialed us
looks direct from here, and every channel to it would otherwise wait out the connect timeout first."""
_unreachable_until: dict[tuple[str, str], float] = {}  # (our peer id, theirs): one process may run many peers
_MAX_REMEMBERED = 4096


def note_socket_unreachable(host: ChannelHost, peer_id: str) -> None:
    """Remember, for UNREACHABLE_FOR_S, that `host` could not reach `peer_id`'s data socket (bounded table)."""
    if len(_unreachable_until) >= _MAX_REMEMBERED:
        _unreachable_until.pop(next(iter(_unreachable_until)))
    _unreachable_until[(getattr(host, "peer_id", ""), peer_id)] = trio.current_time() + UNREACHABLE_FOR_S


def socket_reachable(host: ChannelHost, peer_id: str) -> bool:
    """Whether a data socket to `peer_id` can be tried: not over a relay (the connection's address is the relay's),
    nor over a hole-punched connection (the hole is for libp2p's port only; the data port stays closed behind NAT,
    and each try would cost the connect timeout), nor within UNREACHABLE_FOR_S of a failed try. A host without the
    reachability service (tests' fakes) is judged by the last only."""
    key = (getattr(host, "peer_id", ""), peer_id)
    if _unreachable_until.get(key, -math.inf) > trio.current_time():
        return False
    _unreachable_until.pop(key, None)
    reach = getattr(host, "reach", None)
    if reach is None:
        return True
    return reach.kinds(host.libp2p).get(peer_id, "direct") == "direct"
