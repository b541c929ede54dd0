"""What a peer tells others to dial, as opposed to what it binds.

Why: a multi-machine run listens on every interface (`/ip4/0.0.0.0/tcp/4001`), and the host printed and announced
exactly that: `/ip4/0.0.0.0/tcp/4001/p2p/...`, which another machine cannot dial (on Linux it reaches the dialer's
own host). go-libp2p expands such an address to the machine's interface addresses; so do we, non-loopback first (a
user hands the first printed address to others), loopback last (peers on the same machine). Behind NAT none of
those is the public address: `--announce` replaces them with what the operator knows to be reachable.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Sequence

import psutil
from multiaddr import Multiaddr

from p2p.errors import HostError

UNSPECIFIED = {"ip4": "0.0.0.0", "ip6": "::"}


def interface_ips() -> dict[str, list[str]]:
    """The machine's IPv4 and IPv6 addresses ({"ip4": [...], "ip6": [...]}), loopback last, link-local IPv6 left
    out (it needs a zone to dial)."""
    found: dict[str, list[str]] = {"ip4": [], "ip6": []}
    for addrs in psutil.net_if_addrs().values():
        for a in addrs:
            family = {socket.AF_INET: "ip4", socket.AF_INET6: "ip6"}.get(a.family)
            if family is None:
                continue
            ip = ipaddress.ip_address(a.address.split("%")[0])
            if ip.is_link_local or str(ip) in found[family]:
                continue
            found[family].append(str(ip))
    for family in found:
        found[family].sort(key=lambda text: ipaddress.ip_address(text).is_loopback)  # stable: loopback last
    return found


def dialable(bound: Sequence[str], ips: dict[str, list[str]]) -> list[str]:
    """`bound` multiaddrs with every unspecified IP replaced by each of `ips` of its family (in their order)."""
    out: list[str] = []
    for addr in bound:
        parts = addr.split("/")  # "", "ip4", "0.0.0.0", "tcp", "4001"
        if len(parts) < 3 or UNSPECIFIED.get(parts[1]) != parts[2]:
            out.append(addr)
            continue
        out.extend("/".join([*parts[:2], ip, *parts[3:]]) for ip in ips.get(parts[1], []))
    return list(dict.fromkeys(out))  # one entry per address, first position kept


def check_listen_ports_free(listen: Sequence[str], timeout: float = 0.5) -> None:
    """Refuse, in one sentence, a fixed TCP listen port on which something already accepts connections.

    Why: py-libp2p listens with SO_REUSEPORT (for hole punching), so a second peer started on the same port binds
    it silently and the kernel splits incoming connections between two peers of different ids; dials then fail on
    the peer-id check. Why a connection and not a bind probe: py-libp2p's outgoing connections use the listen port
    too, and a restarted peer must not be refused because its predecessor's connections still linger on it.
    """
    for text in listen:
        addr = Multiaddr(text)  # HostConfig has parsed it already
        protocols = {p.name for p in addr.protocols()}
        if "tcp" not in protocols or not ({"ip4", "ip6"} & protocols) or int(addr.value_for_protocol("tcp")) == 0:
            continue
        port = int(addr.value_for_protocol("tcp"))
        ip = addr.value_for_protocol("ip4") if "ip4" in protocols else addr.value_for_protocol("ip6")
        ip = {"0.0.0.0": "127.0.0.1", "::": "::1"}.get(ip, ip)
        try:
            with socket.create_connection((ip, port), timeout=timeout):
                pass
        except OSError:
            continue  # refused, unreachable or silent: nothing of ours listens there
        raise HostError(f"cannot listen on {text}: port {port} is in use (another peer on this machine?)")
