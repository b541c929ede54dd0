"""Keeping a peer's libp2p connections near a bound: past it, the connections nothing uses are closed.

Why our own: in py-libp2p 0.8.1 nothing bounds them in a large run. Its auto-connector dials peers from the
peerstore (every peer a DHT lookup or identify ever named) until it holds (low + high watermark) / 2 of them, 200
by default; each DHT lookup connects to the peers it asks and leaves those connections open; and its pruner never
closes a connection that has a stream open, while gossip keeps one open to every connected peer. In a run of
1,000 peers a peer would hold hundreds of connections, and gossip sends IHAVE control messages to a quarter of the
connected peers outside its mesh every heartbeat: the per-connection cost that `swarm bench scale` measures,
multiplied by hundreds.

The decision is a pure function (`to_close`); `trim_connections` is its loop, given the narrow things it needs.
A connection is in use when its peer is in our gossip mesh, holds one of our data links, is a relay either way,
is a bootstrap peer, or has a stream open other than gossip's (a DHT query, an offer, a relayed circuit): those
are never closed. The others are closed newest first once they are past a grace period, so a burst of
connections from strangers cannot push out long-lived ones (`to_close`), and a new peer has the grace period to
join our mesh or a data link before it counts as unused.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass

import trio

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TrimConfig:
    """How many connections a peer keeps. Times are seconds."""

    keep: int = 32
    """Connections kept when trimming (swarm's `max_peers`)."""
    slack: int = 8
    """Trimming starts only past keep + slack, so a few connections opening and closing do not churn."""
    grace_s: float = 60.0
    """A connection younger than this is never closed: time for a new peer to join our mesh or a data link."""
    every_s: float = 15.0
    """How often the connections are counted."""

    def __post_init__(self) -> None:
        if self.keep < 1 or self.slack < 0 or self.grace_s < 0 or self.every_s <= 0:
            raise ValueError("keep must be positive, slack and grace_s not negative, every_s positive")


def track(first_seen: dict[str, float], connected: Iterable[str], now: float) -> dict[str, float]:
    """When each peer now connected was first seen connected: kept from `first_seen`, `now` for new ones."""
    return {peer: first_seen.get(peer, now) for peer in connected}


def to_close(first_seen: dict[str, float], in_use: set[str], config: TrimConfig, now: float) -> list[str]:
    """The peers whose connections to close. Only connections past their grace period count: none is closed up to
    keep + slack of them; past it, enough of the unused ones to come back to `keep`, newest first. So connections
    still in their grace period never make an older one close: a stranger that keeps opening connections only
    ever has its own closed, once they are the newest past their grace."""
    mature = [peer for peer, seen in first_seen.items() if now - seen >= config.grace_s]
    if len(mature) <= config.keep + config.slack:
        return []
    unused = sorted((peer for peer in mature if peer not in in_use), key=lambda peer: first_seen[peer], reverse=True)
    return unused[: len(mature) - config.keep]


async def trim_connections(connected: Callable[[], Iterable[str]], in_use: Callable[[], set[str]],
                           disconnect: Callable[[str], Awaitable[None]], config: TrimConfig) -> None:
    """Every `config.every_s`, close the connections `to_close` names. Runs until cancelled."""
    first_seen: dict[str, float] = {}
    while True:
        await trio.sleep(config.every_s)
        now = trio.current_time()
        first_seen = track(first_seen, connected(), now)
        closing = to_close(first_seen, in_use(), config, now)
        if closing:
            log.debug("closing %d unused connections of %d", len(closing), len(first_seen))
        for peer in closing:
            await disconnect(peer)
            first_seen.pop(peer, None)
