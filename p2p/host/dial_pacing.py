"""A node-wide pace for the connections this peer opens, whoever named the address.

Remote peers' claims make py-libp2p dial: identify keeps up to 1,000 addresses a peer claims and the auto-connector
dials peerstore addresses, the DHT's routing refresh dials every peer a FIND_NODE answer names, and announcements
carry addresses that p2p.host.p2p_host.ensure_connected dials. Identities are free, so no per-peer rule bounds what
a crowd of them can make us dial; every outgoing connection attempt (retries included) passes one pacer here, at most
DIALS_PER_S a second after a burst of DIAL_BURST. A dial that would wait more than MAX_DIAL_WAIT_S fails at once
instead of queueing without end. Hole punches have their own tighter bounds (p2p.reach.punch_guard).
"""

from __future__ import annotations

import math

import trio
from libp2p.abc import IHost, INetConn
from libp2p.network.exceptions import SwarmException
from libp2p.peer.id import ID
from multiaddr import Multiaddr

DIALS_PER_S = 16.0
"""Outgoing connection attempts per second, sustained, across all peers and addresses."""
DIAL_BURST = 64
"""Attempts that may go at once after a quiet spell (joining a swarm dials its bootstrap and DHT peers together)."""
MAX_DIAL_WAIT_S = 2.0
"""Longest a dial waits for its turn; past it the dial fails (py-libp2p reports it as any failed dial)."""


class DialPacer:
    """The generic cell rate algorithm: a dial at `now` may go after `delay(now)` seconds, the dials before it keeping
    DIALS_PER_S on average with bursts of DIAL_BURST. Pure: `now` is passed in."""

    def __init__(self, rate: float = DIALS_PER_S, burst: int = DIAL_BURST, max_wait: float = MAX_DIAL_WAIT_S) -> None:
        if rate <= 0 or burst < 1 or max_wait < 0:
            raise ValueError("a dial pace needs a positive rate, a burst of at least 1 and a wait of at least 0")
        self._interval = 1.0 / rate
        self._tolerance = (burst - 1) * self._interval
        self._max_wait = max_wait
        self._next = -math.inf
        self.refused = 0

    def delay(self, now: float) -> float | None:
        """Seconds this dial waits for its turn (its turn is taken), or None: it would wait too long and may not go."""
        due = max(self._next, now)
        wait = max(0.0, due - self._tolerance - now)
        if wait > self._max_wait:
            self.refused += 1
            return None
        self._next = due + self._interval
        return wait


def pace_dials(libp2p_host: IHost, pacer: DialPacer) -> None:
    """Make every outgoing connection attempt of `libp2p_host` wait for its turn on `pacer` (py-libp2p's swarm opens
    each through `_dial_addr_single_attempt`, retries included)."""
    network = libp2p_host.get_network()
    dial_once = network._dial_addr_single_attempt

    async def paced(addr: Multiaddr, peer_id: ID, source: tuple[str, int] | None = None) -> INetConn:
        wait = pacer.delay(trio.current_time())
        if wait is None:
            raise SwarmException(f"dial of {addr} refused: this peer's dial rate is spent")
        if wait > 0:
            await trio.sleep(wait)
        return await dial_once(addr, peer_id, source)

    paced.pacer = pacer  # type: ignore[attr-defined]  # what a test or a metric reads
    network._dial_addr_single_attempt = paced
