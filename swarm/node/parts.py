"""How a node runs its tasks: each one as a part that, failing, stops the peer with one clear line.

Every task of a node (its own networking loops and each role) runs through `run_part`, so a bug or a refused
setting in one of them ends the peer cleanly instead of unwinding the whole nursery as an exception group.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Protocol

import trio

from p2p.host.p2p_host import ensure_connected
from swarm.event_types import RoleFailed
from swarm.node.ports import EventPort, HostPort
from swarm.shutdown import short_path

log = logging.getLogger("swarm.node.node")


class Stoppable(Protocol):
    """What running a part needs of the node (swarm.node.state.Node): where to say a part failed, and how to stop
    the peer; and its host, for the dialing part."""

    events: EventPort
    failed: bool
    done: trio.Event
    host: HostPort


async def run_part(node: Stoppable, part: Callable[..., Awaitable[None]], *args: object) -> None:
    """Run one role, or one of the peer's own tasks, as part(node, *args). One that fails stops the peer with one
    clear line instead of a wall of tracebacks: an exception escaping a task of the node's nursery would end the
    peer (and every peer of a simulation) with a nested exception group."""
    try:
        await part(node, *args)
    except Exception as exc:  # noqa: BLE001 - reported once, then the peer stops cleanly
        name = getattr(part, "__name__", "role")
        message = describe_failure(exc)
        log.debug("%s failed: %s", name, message, exc_info=True)
        node.events.emit(RoleFailed(role=name, message=message))  # the one report: "<role> FAILED: <message>"
        node.failed = True
        node.done.set()


def describe_failure(exc: BaseException) -> str:
    """One line naming what failed and where: the first leaf of an exception group (a role's own nursery wraps
    what its tasks raise; "ExceptionGroup: Exceptions from Trio nursery" said nothing) and the frame that raised it."""
    leaf = exc
    while isinstance(leaf, BaseExceptionGroup) and leaf.exceptions:
        leaf = leaf.exceptions[0]
    tb = leaf.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    where = f" (at {short_path(tb.tb_frame.f_code.co_filename)}:{tb.tb_lineno})" if tb is not None else ""
    return f"{type(leaf).__name__}: {leaf}{where}"


async def dial_any(node: Stoppable, peer: str, addrs: list[str]) -> None:
    """p2p.host.p2p_host.ensure_connected as a task of the node (run_part passes the node first)."""
    await ensure_connected(node.host, peer, addrs)
