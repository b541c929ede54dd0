"""py-libp2p's cap on inbound connections, counted over the connections open now.

py-libp2p admits an inbound connection by taking a place from a `trio.CapacityLimiter` of max_connections -
min_connections places, and gives it back only when its handler returns, which it never does before the whole host
stops (the handler waits for the swarm to finish): every inbound connection a host ever accepted kept its place, and
a public peer that had accepted that many in its life turned every new one away, an honest peer's as a crowd's.
Here the same cap counts the inbound connections open now plus the admissions not yet registered as one (their
handshakes under way; an admission whose handshake failed is let go after the upgrade timeout), so a connection
that ended gives its place back.
"""

from __future__ import annotations

from collections import deque

import trio
from libp2p.abc import INetConn, INetwork
from libp2p.rcmgr import Direction


class OpenInboundCap:
    """Stands in for the swarm's `_inbound_limiter`: `acquire_nowait` admits while the open inbound connections and
    the admissions still in their handshakes are under `total_tokens`; `release` (at the host's end) has nothing to
    give back. A notifee of the swarm: an inbound connection registered ends its admission's handshake."""

    def __init__(self, network: INetwork, total_tokens: int, handshake_s: float) -> None:
        self._network = network
        self.total_tokens = total_tokens
        self._handshake_s = handshake_s
        self._admitted: deque[float] = deque()

    @property
    def borrowed_tokens(self) -> int:
        now = trio.current_time()
        while self._admitted and now - self._admitted[0] > self._handshake_s:
            self._admitted.popleft()
        return self._network.get_metrics().get("inbound", 0) + len(self._admitted)

    def acquire_nowait(self) -> None:
        if self.borrowed_tokens >= self.total_tokens:
            raise trio.WouldBlock
        self._admitted.append(trio.current_time())

    def release(self) -> None:
        pass

    async def connected(self, network: INetwork, conn: INetConn) -> None:
        if self._admitted and getattr(conn, "direction", None) in (Direction.INBOUND, Direction.INBOUND.value):
            self._admitted.popleft()

    async def _ignored(self, *args: object) -> None:
        pass

    opened_stream = closed_stream = disconnected = listen = listen_close = _ignored


def count_open_inbound(network: INetwork) -> None:
    """Replace `network`'s inbound limiter with an OpenInboundCap of the same size."""
    cap = OpenInboundCap(network, int(network._inbound_limiter.total_tokens),
                         network.connection_config.inbound_upgrade_timeout)
    network._inbound_limiter = cap
    network.register_notifee(cap)
