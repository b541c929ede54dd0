"""Closing a host's sockets when it stops, which py-libp2p's host leaves to the process exit."""

from __future__ import annotations

import logging

import trio
from libp2p.abc import IHost, IListener, INetConn

log = logging.getLogger(__name__)


async def close_sockets(libp2p_host: IHost) -> None:
    """Close the host's connections, then its listening sockets. Why: py-libp2p 0.8.1 closes neither when its host
    stops (its swarm's close is never called), so the peers of a closed host keep their connections to it and all
    they granted over them (a relay's reservation, a circuit's place), its port keeps accepting connections nobody
    serves, and a peer restarted in the same process finds its port taken."""
    network = libp2p_host.get_network()
    with trio.move_on_after(5) as scope:
        scope.shield = True
        async with trio.open_nursery() as nursery:  # each close waits a moment for its streams' handlers
            for conns in list(network.connections.values()):
                for conn in list(conns if isinstance(conns, list) else [conns]):
                    nursery.start_soon(_close_quietly, conn)
        for listener in list(network.listeners.values()):
            await _close_quietly(listener)


async def _close_quietly(closable: INetConn | IListener) -> None:
    try:
        await closable.close()
    except Exception as exc:  # noqa: BLE001 - closing is best effort; the process exit closes them anyway
        log.debug("closing %s failed: %s", type(closable).__name__, exc)
