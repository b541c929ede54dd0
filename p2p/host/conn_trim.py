"""Keeping a peer's libp2p connections near a bound: past it, some of the connections nothing uses are closed.

Why our own: in py-libp2p 0.8.1 nothing bounds them in a large run. Its auto-connector dials peers from the
peerstore (every peer a DHT lookup or identify ever named) until it holds (low + high watermark) / 2 of them, 200
by default; each DHT lookup connects to the peers it asks and leaves those connections open; and its pruner never
closes a connection that has a stream open, while gossip keeps one open to every connected peer. In a run of
1,000 peers a peer would hold hundreds of connections, and gossip sends IHAVE control messages to a quarter of the
connected peers outside its mesh every heartbeat.

The decision is a pure function (`to_close`); `trim_connections` is its loop, given the narrow things it needs.
A connection is in use when its peer is in our gossip mesh, holds one of our data links, is a relay either way, is
the trainer or a bootstrap peer, or has a stream open other than gossip's (`libp2p_peers_in_use`): those are never
closed. Which unused ones close is chosen so that no fixed crowd can hold the slots (`to_close`).
"""

from __future__ import annotations

import logging
import random
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass

import trio
from libp2p.abc import INetStream, INetwork
from libp2p.relay.circuit_v2.protocol import CircuitV2Protocol

log = logging.getLogger(__name__)
GOSSIP_PROTOCOL_PREFIXES = ("/meshsub/", "/floodsub/")
"""Streams of these protocols stay open to every connected peer: they do not make a connection "in use"."""
DHT_PROTOCOL = "/ipfs/kad/1.0.0"
"""A DHT stream keeps its connection only if we opened it: Kademlia lets the asker hold its stream open idle."""


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
        if self.keep < 2 or self.slack < 0 or self.grace_s < 0 or self.every_s <= 0:
            raise ValueError("keep must be at least 2, slack and grace_s not negative, every_s positive")


def track(first_seen: dict[str, float], connected: Iterable[str], now: float) -> dict[str, float]:
    """When each peer now connected was first seen connected: kept from `first_seen`, `now` for new ones."""
    return {peer: first_seen.get(peer, now) for peer in connected}


def to_close(first_seen: dict[str, float], in_use: set[str], config: TrimConfig, now: float,
             rng: random.Random) -> list[str]:
    """The peers whose connections to close.

    Only connections past their grace period count, so a burst of new ones never makes an older one close. Past
    keep + slack of them, the unused ones get `keep` minus those in use, and at least keep / 2 whatever is in use
    (a crowd that makes itself useful cannot squeeze out every other peer). Of the unused ones, the oldest half of
    that room stays (long-lived connections are not churned) and the excess closes at random among the rest (drawn
    with `rng`, a secret one in production), so neither peers that connected first nor a crowd that connects last
    can hold the slots for good.
    """
    mature = [peer for peer, seen in first_seen.items() if now - seen >= config.grace_s]
    if len(mature) <= config.keep + config.slack:
        return []
    unused = sorted((peer for peer in mature if peer not in in_use), key=lambda peer: (first_seen[peer], peer))
    room = max(config.keep - (len(mature) - len(unused)), config.keep // 2)
    excess = len(unused) - room
    if excess <= 0:
        return []
    return rng.sample(unused[room // 2:], excess)


def libp2p_peers_in_use(network: INetwork, relay: CircuitV2Protocol | None, relays: Iterable[str]) -> set[str]:
    """Peers of py-libp2p `network` (a Swarm) whose connection carries more than gossip: an open stream of another
    protocol (`keeps_connection`), or a relay reservation, theirs on `relay` (our relay protocol, or None) or ours
    on `relays` (peer ids)."""
    busy = set(relays)
    for peer_id, connections in list(network.connections.items()):
        if relay is not None and relay.resource_manager.has_reservation(peer_id):
            busy.add(str(peer_id))
        if any(keeps_connection(stream) for connection in list(connections) for stream in connection.get_streams()):
            busy.add(str(peer_id))
    return busy


def keeps_connection(stream: INetStream) -> bool:
    """Whether an open stream makes its connection in use: any but gossip's and DHT streams a peer opened to us,
    and not one closed both ways or reset (a stream whose close was interrupted stays listed, and must not pin its
    connection for good)."""
    muxed = getattr(stream, "muxed_stream", None)
    if getattr(muxed, "reset_received", False) or (getattr(muxed, "send_closed", False)
                                                   and getattr(muxed, "recv_closed", False)):
        return False
    protocol = str(stream.get_protocol() or "")
    if protocol.startswith(GOSSIP_PROTOCOL_PREFIXES):
        return False
    return protocol != DHT_PROTOCOL or bool(getattr(muxed, "is_initiator", False))


async def trim_connections(connected: Callable[[], Iterable[str]], in_use: Callable[[], set[str]],
                           disconnect: Callable[[str], Awaitable[None]], config: TrimConfig) -> None:
    """Every `config.every_s`, close the connections `to_close` names, each only if it is still unused when its
    turn comes. A round that fails (py-libp2p's tables are read as they are) is logged and the next one tries
    again: trimming is housekeeping, never a reason to stop the peer. Runs until cancelled."""
    first_seen: dict[str, float] = {}
    rng = random.SystemRandom()
    while True:
        await trio.sleep(config.every_s)
        try:
            now = trio.current_time()
            first_seen = track(first_seen, connected(), now)
            closing = to_close(first_seen, in_use(), config, now, rng)
            if closing:
                log.debug("closing %d unused connections of %d", len(closing), len(first_seen))
            for peer in closing:
                if peer not in in_use():
                    await disconnect(peer)
                    first_seen.pop(peer, None)
        except Exception as exc:  # noqa: BLE001 - housekeeping over py-libp2p internals: skip this round
            log.warning("connection trimming skipped a round: %s: %s", type(exc).__name__, exc)
