"""Which hole punches (DCUtR sessions) this peer takes part in, and which addresses a session may dial.

A DCUtR session dials the addresses the other end names in its CONNECT message. The other end is a stranger that
reached us through a relay; identities are free and reconnecting is free, so every bound here is node-wide and
none resets when a peer reconnects:

- sessions: at most MAX_PUNCH_ATTEMPTS per peer id within PUNCH_WINDOW_S (remembered for PUNCH_MEMORY ids), at most
  MAX_PUNCHES_AT_ONCE under way, at most SESSIONS_PER_S started per second by others in all, and as many by us (a
  crowd opening sessions toward us does not spend those we start, though by reaching us through relays it makes us
  start some);
- addresses: only plain TCP/IP ones (no DNS name to resolve, no relay), all of them on ONE IP (a peer behind a NAT
  has one public address; a list spanning many IPs names hosts that are not the peer), at most SESSION_ADDRS of
  them, and sessions toward any one IP (an IPv6 /64 counting as one) at most IP_SESSIONS within PUNCH_WINDOW_S
  whoever asks;
- dials: only the addresses admitted for that peer's session under way, at most DIALS_PER_S per second in all.

Pure: `now` is passed in; the IO is p2p.reach.service.
"""

from __future__ import annotations

import ipaddress
from collections import OrderedDict
from collections.abc import Sequence

from p2p.ratelimit import Allowance
from p2p.reach.relay_limits import ip_group

MAX_PUNCH_ATTEMPTS = 3
"""DCUtR sessions with one peer id, started by either end, within PUNCH_WINDOW_S (each tries three rounds)."""
MAX_PUNCHES_AT_ONCE = 8
"""DCUtR sessions under way at once, ours and those peers start toward us together."""
PUNCH_WINDOW_S = 3600.0
"""How long a session counts against its peer id and its target IP: a disconnect does not end it."""
PUNCH_MEMORY = 4096
"""Peer ids and target IPs remembered (oldest forgotten first): the tables do not grow with identities, and
refilling them to forget one takes PUNCH_MEMORY sessions at SESSIONS_PER_S (over two hours)."""
SESSIONS_PER_S = 0.5
"""DCUtR sessions started per second, by either end, across all peers (bursts of SESSIONS_BURST)."""
SESSIONS_BURST = 4.0
SESSION_ADDRS = 2
"""Addresses one session dials (each up to three rounds): one IP, a listen port or two."""
IP_SESSIONS = 8
"""Sessions that dial any one IP within PUNCH_WINDOW_S, whichever peer ids ask."""
DIALS_PER_S = 2.0
"""Hole-punch dials per second across all sessions (bursts of DIALS_BURST)."""
DIALS_BURST = 12.0


def tcp_endpoint(addr: str) -> tuple[str, int] | None:
    """(ip, port) of a plain `/ip4|ip6/<ip>/tcp/<port>[/p2p/<id>]` address a hole punch may dial; None for any other
    (a DNS name, a relay, another transport, an unspecified, multicast or broadcast IP, port 0)."""
    parts = addr.split("/")
    if len(parts) not in (5, 7) or parts[0] or parts[1] not in ("ip4", "ip6") or parts[3] != "tcp":
        return None
    if len(parts) == 7 and parts[5] != "p2p":
        return None
    try:
        ip = ipaddress.ip_address(parts[2])
        port = int(parts[4])
    except ValueError:
        return None
    if ip.is_unspecified or ip.is_multicast or str(ip) == "255.255.255.255" or not 0 < port < 65536:
        return None
    return str(ip), port


class _Counts:
    """Events per key within a window, for at most `memory` keys (the oldest forgotten first)."""

    def __init__(self, window: float, memory: int) -> None:
        self._window = window
        self._memory = memory
        self._seen: OrderedDict[str, tuple[int, float]] = OrderedDict()

    def count(self, key: str, now: float) -> int:
        entry = self._seen.get(key)
        if entry is None or now - entry[1] >= self._window:
            return 0
        return entry[0]

    def add(self, key: str, now: float) -> None:
        count = self.count(key, now)
        first = self._seen[key][1] if count else now
        self._seen[key] = (count + 1, first)
        self._seen.move_to_end(key)
        while len(self._seen) > self._memory:
            self._seen.popitem(last=False)

    def __len__(self) -> int:
        return len(self._seen)


class PunchGuard:
    """The node-wide bounds on hole punches, whoever starts them."""

    def __init__(self) -> None:
        self.punching: set[str] = set()
        """Peers a session with is under way."""
        self._sessions = _Counts(PUNCH_WINDOW_S, PUNCH_MEMORY)
        self._ips = _Counts(PUNCH_WINDOW_S, PUNCH_MEMORY)
        self._session_rate = {ours: Allowance(SESSIONS_PER_S, SESSIONS_BURST) for ours in (True, False)}
        self._dial_rate = Allowance(DIALS_PER_S, DIALS_BURST)
        self._admitted: dict[str, set[tuple[str, int]]] = {}
        self.refused = 0

    def attempts(self, peer: str, now: float) -> int:
        """Sessions with `peer` within the window, reconnects or not."""
        return self._sessions.count(peer, now)

    def remembered(self) -> int:
        return len(self._sessions)

    def may_start(self, peer: str, now: float, ours: bool = False) -> bool:
        """Whether a session with `peer` (`ours`: one we start) may start now; if so it is counted as started (call
        `end` when done)."""
        if (peer in self.punching or len(self.punching) >= MAX_PUNCHES_AT_ONCE
                or self.attempts(peer, now) >= MAX_PUNCH_ATTEMPTS or not self._session_rate[ours].take(1, now)):
            self.refused += 1
            return False
        self.punching.add(peer)
        self._sessions.add(peer, now)
        return True

    def end(self, peer: str) -> None:
        self.punching.discard(peer)
        self._admitted.pop(peer, None)

    def admit(self, peer: str, addrs: Sequence[str], now: float) -> list[str]:
        """The addresses of `peer`'s CONNECT message its session under way may dial: plain TCP ones on the IP of the
        first, at most SESSION_ADDRS, none when that IP had IP_SESSIONS sessions within the window."""
        if peer not in self.punching:
            return []
        kept: list[str] = []
        kept_ip = ""
        endpoints: set[tuple[str, int]] = set()
        for addr in addrs:
            endpoint = tcp_endpoint(addr)
            if endpoint is None or endpoint in endpoints or (kept and endpoint[0] != kept_ip):
                continue
            kept_ip = endpoint[0]
            endpoints.add(endpoint)
            kept.append(addr)
            if len(kept) >= SESSION_ADDRS:
                break
        if not kept or self._ips.count(ip_group(kept_ip), now) >= IP_SESSIONS:
            return []
        self._ips.add(ip_group(kept_ip), now)
        self._admitted[peer] = endpoints
        return kept

    def may_dial(self, peer: str, addr: str, now: float) -> bool:
        """Whether a hole-punch dial of `addr` for `peer` may go now: an address admitted for its session under way,
        within the node-wide dial rate."""
        endpoint = tcp_endpoint(addr)
        if endpoint is None or endpoint not in self._admitted.get(peer, ()):
            return False
        return self._dial_rate.take(1, now)
