"""A host's reachability service: the dial-back check, relaying, reservations and hole punching, run together.

p2p.host.p2p_host opens it once the bootstrap peers are dialed, so what a peer announces (`P2PHost.multiaddrs`) already
says how to reach it when the node starts gossiping. See p2p/reach/probe.py for the decisions, p2p/reach/relay.py for
relaying.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

import trio
from libp2p.abc import IHost, INetConn, INetStream
from libp2p.peer.id import ID
from libp2p.relay.circuit_v2.dcutr import PROTOCOL_ID as DCUTR_PROTOCOL

from p2p.bootstrap import peer_id_of
from p2p.reach.host_view import ReachHost
from p2p.reach.probe import (
    DIALBACK_PROTOCOL,
    DialBackServer,
    Reachability,
    ReachConfig,
    ask_dial_back,
    punch_targets,
    verdict,
)
from p2p.reach.punch_guard import PunchGuard
from p2p.reach.punching import GuardedDCUtR, hole_punching
from p2p.reach.relay import Relaying, connection_kind, is_circuit, open_relaying
from p2p.reach.relay_limits import kind_settled

log = logging.getLogger(__name__)
MAX_REMEMBERED = 4096
WATCH_EVERY_S = 1.0
"""How often connections are looked at to tell a hole-punched connection (relayed first) from a direct one."""


@dataclass
class ReachState:
    """What a host knows about its own reachability and how each peer is connected."""

    status: Reachability
    relaying: Relaying
    dcutr: GuardedDCUtR | None = None
    ever_relayed: dict[str, None] = field(default_factory=dict)
    """Peers once connected through a relay (oldest first, at most MAX_REMEMBERED): a direct connection to one of
    them now is a hole-punched one."""
    punches: PunchGuard = field(default_factory=PunchGuard)
    """The node-wide bounds on hole punches, started by us or by them (p2p.reach.punch_guard)."""

    @property
    def punching(self) -> set[str]:
        """Peers a hole punch with is under way, started by us or by them."""
        return self.punches.punching

    @property
    def relayed_addrs(self) -> list[str]:
        """`<relay addr>/p2p-circuit` for each relay holding our reservation (the host appends /p2p/<me>)."""
        return [f"{addr}/p2p-circuit" for addr in self.relaying.reservations.values()]

    def kinds(self, libp2p_host: IHost) -> dict[str, str]:
        """Peer id -> "direct", "relayed" or "hole-punched" (direct now, relayed before) for each connected peer."""
        self.note_relayed(libp2p_host)
        out: dict[str, str] = {}
        for peer, conns in libp2p_host.get_network().connections.items():
            kinds = {connection_kind(c) for c in _as_list(conns)}
            direct = "direct" in kinds
            peer = str(peer)
            out[peer] = ("hole-punched" if peer in self.ever_relayed else "direct") if direct else "relayed"
        return out

    def note_relayed(self, libp2p_host: IHost) -> None:
        for peer, conns in libp2p_host.get_network().connections.items():
            if any(connection_kind(c) == "relayed" for c in _as_list(conns)):
                self.ever_relayed[str(peer)] = None
        while len(self.ever_relayed) > MAX_REMEMBERED:  # identities are free: the table must not grow with them
            del self.ever_relayed[next(iter(self.ever_relayed))]


def _listen_port(host: ReachHost) -> int:
    for addr in host.bound_multiaddrs:
        parts = addr.split("/")
        if "tcp" in parts:
            return int(parts[parts.index("tcp") + 1])
    return 0


def _connected_bootstrap(host: ReachHost) -> list[str]:
    connected = {str(p) for p in host.libp2p.get_connected_peers()}
    return [a for a in host.config.bootstrap if not is_circuit(a) and peer_id_of(a) in connected]


def _as_list(conns: INetConn | list[INetConn]) -> list[INetConn]:
    """A peer's connections as a list: py-libp2p's network maps a peer to one connection or to a list of them."""
    return conns if isinstance(conns, list) else [conns]


def _we_dialed(conn: INetConn) -> bool:
    """Whether this end opened the connection (its muxer's initiator); unknown counts as dialed: no punch from here."""
    try:
        return bool(conn.muxed_conn.is_initiator)
    except Exception:  # noqa: BLE001 - a connection closing under us
        return True


def _connections_seen(state: ReachState, libp2p_host: IHost) -> tuple:
    """What noting relayed connections and starting punches depend on: the connections open (the objects, compared
    by identity, so a new connection never passes for a closed one) and the punches under way. Why: unchanged, a
    watch round would find what the last one did, and listing every connection's peer id and kind each second is
    about half a millisecond of an idle peer's CPU a second."""
    conns = libp2p_host.get_network().connections.values()
    return tuple(conn for entry in conns for conn in _as_list(entry)), frozenset(state.punching)


def _drive_punches(state: ReachState, libp2p_host: IHost, nursery: trio.Nursery) -> bool:
    """Start a hole punch, each in its own task, to every peer p2p.reach.probe.punch_targets names that the guard's
    rate lets start now; True when it put one off (the watcher then looks again next round)."""
    connections = libp2p_host.get_network().connections
    ids = {str(peer): peer for peer in connections}
    links = {str(peer): [(connection_kind(c) == "relayed", _we_dialed(c))
                         for c in _as_list(conns)]
             for peer, conns in connections.items()}
    now = trio.current_time()
    attempts = {peer: state.punches.attempts(peer, now) for peer in links}
    put_off = False
    for peer in punch_targets(str(libp2p_host.get_id()), links, state.punching, attempts):
        if state.punches.may_start(peer, now, ours=True):
            nursery.start_soon(_punch, state, ids[peer])
        else:
            put_off = True
    return put_off


async def _punch(state: ReachState, peer_id: ID) -> None:
    try:
        await state.dcutr.initiate_hole_punch(peer_id)
    except Exception as exc:  # noqa: BLE001 - a failed punch leaves the relayed connection as it was
        log.debug("hole punch to %s failed: %s", peer_id, exc)
    finally:
        state.punches.end(str(peer_id))


async def _answer_punch(state: ReachState, stream: INetStream) -> None:
    """Serve a DCUtR session a peer starts toward us within the node-wide bounds of our own
    (p2p.reach.punch_guard.PunchGuard); past them the stream is reset: the peer's relayed connection stays as it is."""
    peer = str(stream.muxed_conn.peer_id)
    if not state.punches.may_start(peer, trio.current_time()):
        await stream.reset()
        return
    try:
        await state.dcutr._handle_dcutr_stream(stream)
    finally:
        state.punches.end(peer)


async def check_reachability(host: ReachHost, config: ReachConfig) -> Reachability:
    """Ask every connected bootstrap peer at once to dial us back; the verdict of p2p.reach.probe.verdict."""
    if config.mode != "auto":
        return Reachability(config.mode)
    answers: list[bool | None] = []
    port = _listen_port(host)

    async def ask(peer: str) -> None:
        answers.append(await ask_dial_back(host, peer, port, config.dial_back_timeout_s + 2))

    async with trio.open_nursery() as nursery:
        for addr in _connected_bootstrap(host):
            nursery.start_soon(ask, peer_id_of(addr))
    return verdict(answers)


async def _reserve(host: ReachHost, relaying: Relaying, config: ReachConfig, nursery: trio.Nursery) -> None:
    for addr in _connected_bootstrap(host):
        if len(relaying.reservations) >= config.max_relays:
            return
        await relaying.reserve(addr, peer_id_of(addr), nursery, config.dial_back_timeout_s + 2)


async def _watch(state: ReachState, host: ReachHost, config: ReachConfig, nursery: trio.Nursery) -> None:
    """Note relayed connections; start hole punches; ask again when nobody could be asked at start; a private peer
    whose relay connection closed redials it and reserves again.

    Why redial: DCUtR closes the relayed connection to a peer once the hole-punched one holds, and the relay's own
    connection can go with it (seen behind NAT in tests/p2p/test_reach_netns.py); without a reservation the peer is
    unreachable to anyone new."""
    next_check = next_redial = trio.current_time() + config.recheck_s
    seen: tuple = ()
    while True:
        if _connections_seen(state, host.libp2p) != seen:  # else nothing to note or punch anew
            state.note_relayed(host.libp2p)
            put_off = state.dcutr is not None and _drive_punches(state, host.libp2p, nursery)
            seen = _connections_seen(state, host.libp2p)  # with the punches just started
            if put_off or not all(map(kind_settled, seen[0])):  # a punch to start later, or one that showed no
                seen = ()  # address yet passed for direct: look again
        if (state.status is Reachability.UNKNOWN and config.mode == "auto" and trio.current_time() >= next_check
                and _connected_bootstrap(host)):
            next_check = trio.current_time() + config.recheck_s
            state.status = await check_reachability(host, config)
            if state.status is Reachability.PRIVATE:
                await _reserve(host, state.relaying, config, nursery)
                log.info("reachability: private, relayed through %d relay(s)", len(state.relaying.reservations))
        if state.status is Reachability.PRIVATE and trio.current_time() >= next_redial:
            next_redial = trio.current_time() + WATCH_EVERY_S * 4
            connected = {str(p) for p in host.libp2p.get_connected_peers()}
            for relay, addr in list(state.relaying.reservations.items()):
                if relay not in connected:
                    del state.relaying.reservations[relay]
                    try:
                        await host.redial(addr)
                    except Exception as exc:  # noqa: BLE001 - HostError mostly; tried again next time
                        log.debug("relay %s unreachable: %s", relay, exc)
                        state.relaying.reservations[relay] = addr
                        continue
                    await state.relaying.reserve(addr, relay, nursery, config.dial_back_timeout_s + 2)
        await trio.sleep(WATCH_EVERY_S)


@asynccontextmanager
async def open_reach(host: ReachHost) -> AsyncIterator[ReachState]:
    """Serve dial-backs, learn our reachability, relay for others when public, reserve relays when private, punch
    holes; undone on exit."""
    config: ReachConfig = host.config.reach
    server = DialBackServer(config)
    host.set_guarded_handler(DIALBACK_PROTOCOL, server.handle, timeout=config.dial_back_timeout_s + 5)
    status = await check_reachability(host, config)
    hop = status is not Reachability.PRIVATE and config.relay.serve
    punches = PunchGuard()
    async with open_relaying(host, config.relay, hop) as relaying, \
            hole_punching(host.libp2p, punches, config.hole_punch) as dcutr, trio.open_nursery() as nursery:
        state = ReachState(status, relaying, dcutr, punches=punches)
        if dcutr is not None:
            host.set_guarded_handler(DCUTR_PROTOCOL, functools.partial(_answer_punch, state), timeout=None)
        if status is Reachability.PRIVATE:
            await _reserve(host, relaying, config, nursery)
            if not relaying.reservations:
                log.warning("this peer is not reachable and no bootstrap peer granted it a relay reservation")
        log.info("reachability: %s%s", status.value,
                 f", relayed through {len(relaying.reservations)} relay(s)" if relaying.reservations else "")
        nursery.start_soon(_watch, state, host, config, nursery)
        try:
            yield state
        finally:
            nursery.cancel_scope.cancel()
