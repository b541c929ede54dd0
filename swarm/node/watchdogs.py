"""A peer that cannot take part ends with status 1 and says why, instead of waiting for ever.

Two cases a user hits first: every bootstrap peer unreachable (a typo in the address, a firewall), retried with
backoff and one line per try until `bootstrap_timeout_s`; and a wrong `--trainer-key`, whose refusals
swarm.policy.trust.RefusalReport folds into a line a minute, given up after `wrong_key_timeout_s`. Both run as parts
of the node (swarm.node.parts.run_part) and stop the peer the way a failed role does.
"""

from __future__ import annotations

import logging

import trio

from p2p.bootstrap import peer_id_of
from p2p.errors import P2PError
from swarm.event_types import BootstrapGaveUp, BootstrapReconnected, BootstrapRetry, TrainerKeyGaveUp
from swarm.node.state import Node

log = logging.getLogger(__name__)

FIRST_RETRY_S = 1.0
WRONG_KEY_CHECK_S = 5.0


def bootstrap_backoff(attempt: int, most_s: float) -> float:
    """Seconds before retry number `attempt` (1, 2, ...): doubling from FIRST_RETRY_S, at most `most_s`."""
    return min(most_s, FIRST_RETRY_S * 2 ** (attempt - 1))


def give_up(node: Node, why: BootstrapGaveUp | TrainerKeyGaveUp) -> None:
    """Stop the peer with status 1 after one line saying why."""
    node.events.emit(why)
    node.failed = True
    node.done.set()


async def reach_bootstrap(node: Node, bootstrap: tuple[str, ...]) -> None:
    """Dial the bootstrap peers until one answers; give up after `bootstrap_timeout_s` (0: never).

    Returns at once when there is none to reach (the first peer of a run) or one is connected already; after that
    swarm.node.node's redial loop keeps the links."""
    peer = node.config.peer
    wanted = {addr: peer_id_of(addr) for addr in bootstrap if peer_id_of(addr) != node.peer_id}
    started = trio.current_time()
    attempt = 0
    while wanted and not set(wanted.values()) & set(node.connected_peers()):
        attempt += 1
        reasons = []
        for addr in wanted:
            why = await _dial(node, addr)
            if why is None:
                node.events.emit(BootstrapReconnected(address=addr,
                                                      message=f"connected to bootstrap peer {addr} (try {attempt})"))
                return
            reasons.append(why)
        waited = trio.current_time() - started
        if peer.bootstrap_timeout_s and waited >= peer.bootstrap_timeout_s:
            give_up(node, BootstrapGaveUp(message=f"no bootstrap peer answered in {waited:.0f} s "
                                                  f"({attempt} tries; the last: {reasons[0]}); exiting"))
            return
        delay = bootstrap_backoff(attempt, peer.bootstrap_redial_s)
        node.events.emit(BootstrapRetry(attempt=attempt, delay_s=delay, message=(
            f"no bootstrap peer reachable (try {attempt}, {waited:.0f} s so far): {reasons[0]}; "
            f"trying again in {delay:.0f} s")))
        await trio.sleep(delay)


async def _dial(node: Node, addr: str) -> str | None:
    """None when `addr` answered, else why not."""
    try:
        await node.host.redial(addr)
    except P2PError as exc:
        log.debug("bootstrap peer %s unreachable: %s", addr, exc, exc_info=True)
        return str(exc) if addr in str(exc) else f"{addr}: {exc}"
    return None


async def watch_trainer_key(node: Node) -> None:
    """Stop the peer once it has refused manifests for `wrong_key_timeout_s` and accepted none."""
    report = node.mirror.trust.report
    while not report.gave_up(trio.current_time()):
        await trio.sleep(WRONG_KEY_CHECK_S)
    give_up(node, TrainerKeyGaveUp(message=(
        f"no policy manifest signed by the run's trainer key in {report.give_up_after_s:.0f} s, only ones signed by "
        "another key (named above); check --trainer-key; exiting")))
