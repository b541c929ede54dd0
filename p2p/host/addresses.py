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
