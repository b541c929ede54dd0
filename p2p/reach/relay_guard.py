"""What a relay grants: reservations and circuits, bounded node-wide and per holder, released when holders leave.

py-libp2p's relay keeps a reservation for an hour after its holder disconnects and counts it against its cap all
that time, lets the HOP RESERVE message name any peer id to reserve for, and counts a circuit against its
destination's cap only once the circuit is up (so circuits requested together all pass the check). Identities are
free, so what a crowd of them can hold is bounded here for the node as a whole, and per holder (peer id, and the IP
it connects from) on top:

- a reservation is held by the peer id of the connection that asked, at most `max_reservations` in all and
  `max_reservations_per_ip` from one IP; once its holder has no connection to us it stops serving circuits at once
  (py-libp2p checks that) and after RESERVATION_GRACE_S it is gone, its place free for another peer;
- a circuit is counted from the moment it is asked for until it ends: at most `max_circuits_per_peer` to one
  destination, from one source and from one source IP, `max_circuits` in all, `circuits_per_s` opened per second
  in all and IP_RATE_SHARE of that from one source IP. Why a share per IP: circuits that end as soon as they open
  never meet the caps on open circuits, so one address asking without pause would spend the whole rate and no
  honest circuit would open through this relay; with the share it takes several addresses (IP_MEMORY remembered,
  least recently asking forgotten first).

Pure: `now` is passed in; the IO is p2p.reach.relay.
"""

from __future__ import annotations

from collections import Counter, OrderedDict
from collections.abc import Collection
from dataclasses import dataclass

from p2p.ratelimit import Allowance
from p2p.reach.relay_limits import RelayLimits, ip_group

STOP_PER_S = 4.0
"""Relayed connections this peer accepts as their destination per second, through all its relays (bursts of
STOP_BURST): each costs a whole connection's handshakes."""
STOP_BURST = 16.0
RESERVATION_GRACE_S = 2.0
IP_RATE_SHARE = 0.25
"""Share of the relay's circuit rate (and burst) the circuits asked from one source IP may spend."""
IP_MEMORY = 4096
"""Source IPs whose share of the circuit rate is remembered."""
"""How long a reservation outlives its holder's last connection (a reconnect within it keeps its place)."""


@dataclass
class _Holder:
    ip: str
    left_at: float | None = None


class RelayGuard:
    """The reservations and circuits a relay holds, and whether to grant one more."""

    def __init__(self, limits: RelayLimits) -> None:
        self.limits = limits
        self._holders: dict[str, _Holder] = {}
        self._circuits_to: Counter[str] = Counter()
        self._circuits_from: Counter[str] = Counter()
        self._circuits_from_ip: Counter[str] = Counter()
        self.circuits = 0
        self._circuit_rate = Allowance(limits.circuits_per_s, max(1.0, 4 * limits.circuits_per_s))
        self._ip_rates: OrderedDict[str, Allowance] = OrderedDict()
        self.refused = 0

    @property
    def holders(self) -> list[str]:
        return list(self._holders)

    def admit_reservation(self, peer: str, ip: str) -> bool:
        """Whether `peer`, connected from `ip`, may hold (or renew) a reservation; if so it holds one. An IPv6
        address counts with its /64."""
        ip = ip_group(ip)
        holder = self._holders.get(peer)
        if holder is not None and holder.ip == ip:
            holder.left_at = None
            return True
        others = [h for p, h in self._holders.items() if p != peer]
        if len(others) >= self.limits.max_reservations or \
                sum(h.ip == ip for h in others) >= self.limits.max_reservations_per_ip:
            self.refused += 1
            return False
        self._holders[peer] = _Holder(ip)
        return True

    def sweep(self, present: Collection[str], now: float) -> list[str]:
        """The holders to drop now: those not `present` (connected, with a live reservation) for RESERVATION_GRACE_S;
        they are forgotten here and the caller drops them from py-libp2p's table."""
        gone: list[str] = []
        for peer, holder in list(self._holders.items()):
            if peer in present:
                holder.left_at = None
            elif holder.left_at is None:
                holder.left_at = now
            elif now - holder.left_at >= RESERVATION_GRACE_S:
                del self._holders[peer]
                gone.append(peer)
        return gone

    def open_circuit(self, source: str, source_ip: str, destination: str, now: float) -> bool:
        """Whether a circuit from `source` (connected from `source_ip`) to `destination` may open now; if so it counts
        until `close_circuit` with the same arguments."""
        cap = self.limits.max_circuits_per_peer
        ends = self._ends(source, source_ip, destination)
        ip_rate = self._ip_rate(ip_group(source_ip))
        if (any(counts[key] >= cap for counts, key in ends) or self.circuits >= self.limits.max_circuits
                or ip_rate.available(now) < 1 or not self._circuit_rate.take(1, now)):
            self.refused += 1
            return False
        ip_rate.take(1, now)
        for counts, key in ends:
            counts[key] += 1
        self.circuits += 1
        return True

    def close_circuit(self, source: str, source_ip: str, destination: str) -> None:
        for counts, key in self._ends(source, source_ip, destination):
            counts[key] -= 1
            if counts[key] <= 0:
                del counts[key]
        self.circuits -= 1

    def _ip_rate(self, ip: str) -> Allowance:
        rate = self._ip_rates.pop(ip, None)
        if rate is None:
            share = self.limits.circuits_per_s * IP_RATE_SHARE
            rate = Allowance(share, max(1.0, 4 * share))
        self._ip_rates[ip] = rate
        while len(self._ip_rates) > IP_MEMORY:
            self._ip_rates.popitem(last=False)
        return rate

    def _ends(self, source: str, source_ip: str, destination: str) -> list[tuple[Counter[str], str]]:
        return [(self._circuits_to, destination), (self._circuits_from, source),
                (self._circuits_from_ip, ip_group(source_ip))]


class CircuitAcceptor:
    """Which relayed connections this peer accepts as their destination (py-libp2p's STOP handler accepts any, from
    any peer that opens the stream, for any source id it names): only through a relay holding our reservation (no
    other relay has a reason to bring us one), at most STOP_PER_S a second in all."""

    def __init__(self) -> None:
        self._rate = Allowance(STOP_PER_S, STOP_BURST)
        self.refused = 0

    def accept(self, relay: str, reserved: Collection[str], now: float) -> bool:
        if relay in reserved and self._rate.take(1, now):
            return True
        self.refused += 1
        return False
