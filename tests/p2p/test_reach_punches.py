"""Hole punches (DCUtR) a crowd of identities starts toward us: the sessions we take part in and the addresses
they dial are bounded node-wide, for any number of identities, and reconnecting resets nothing."""

from __future__ import annotations

from types import SimpleNamespace

import trio

from p2p.reach.probe import MAX_PUNCH_ADDRS, Reachability
from p2p.reach.punch_guard import (
    DIALS_BURST,
    DIALS_PER_S,
    IP_SESSIONS,
    MAX_PUNCH_ATTEMPTS,
    MAX_PUNCHES_AT_ONCE,
    PUNCH_MEMORY,
    SESSION_ADDRS,
    SESSIONS_BURST,
    SESSIONS_PER_S,
    PunchGuard,
    tcp_endpoint,
)
from p2p.reach.service import ReachState, _answer_punch, _drive_punches

THIRD_PARTY = [f"/ip4/203.0.113.{i}/tcp/80" for i in range(1, 9)]
"""Hosts outside the swarm a stranger names in its CONNECT message."""


class _Stream:
    def __init__(self, peer: str, refused: list[str]) -> None:
        self.muxed_conn = SimpleNamespace(peer_id=peer)
        self._refused = refused

    async def reset(self) -> None:
        self._refused.append(self.muxed_conn.peer_id)


class _Sessions:
    """DCUtR as `_answer_punch` sees it: each session takes `seconds`."""

    def __init__(self, seconds: float = 0.0) -> None:
        self.seconds = seconds
        self.served: list[str] = []

    async def _handle_dcutr_stream(self, stream) -> None:
        self.served.append(str(stream.muxed_conn.peer_id))
        await trio.sleep(self.seconds)


def _nobody_connected():
    return SimpleNamespace(get_network=lambda: SimpleNamespace(connections={}), get_id=lambda: "me")


async def test_reconnecting_does_not_reset_a_peers_punch_budget(autojump_clock):
    """A stranger that disconnects and comes back (the watcher sees it gone in between) gets no fresh sessions."""
    sessions, refused = _Sessions(), []
    state = ReachState(Reachability.PRIVATE, relaying=None, dcutr=sessions)
    async with trio.open_nursery() as nursery:
        for _ in range(4):
            for _ in range(MAX_PUNCH_ATTEMPTS):
                await _answer_punch(state, _Stream("stranger", refused))
                await trio.sleep(10)
            _drive_punches(state, _nobody_connected(), nursery)  # it left; then it reconnects
    assert sessions.served == ["stranger"] * MAX_PUNCH_ATTEMPTS


async def test_a_crowd_of_identities_starts_few_sessions_a_second_in_all(autojump_clock):
    """1,000 fresh identities, each asking once a second for a minute: what we take part in is the node's session
    rate, not the crowd's size."""
    sessions, refused = _Sessions(seconds=0.5), []
    state = ReachState(Reachability.PRIVATE, relaying=None, dcutr=sessions)
    async with trio.open_nursery() as nursery:
        for _ in range(60):
            for i in range(1000):
                nursery.start_soon(_answer_punch, state, _Stream(f"id{i}", refused))
            await trio.sleep(1)
    assert len(sessions.served) <= SESSIONS_BURST + 60 * SESSIONS_PER_S + 1


async def test_sessions_strangers_start_toward_us_share_the_bounds_of_our_own(autojump_clock):
    """One session at a time per peer, MAX_PUNCHES_AT_ONCE in all, whether they come at once or spread out."""
    sessions, refused = _Sessions(seconds=100), []
    state = ReachState(Reachability.PRIVATE, relaying=None, dcutr=sessions)
    async with trio.open_nursery() as nursery:
        for i in range(3 * MAX_PUNCHES_AT_ONCE):
            nursery.start_soon(_answer_punch, state, _Stream(f"stranger{i}", refused))
            await trio.sleep(1 / SESSIONS_PER_S)
        nursery.start_soon(_answer_punch, state, _Stream("stranger0", refused))  # a second session at once
        await trio.sleep(1)
        assert len(sessions.served) == MAX_PUNCHES_AT_ONCE and len(refused) == 2 * MAX_PUNCHES_AT_ONCE + 1
        nursery.cancel_scope.cancel()
    assert state.punching == set()


def test_only_plain_tcp_addresses_are_punch_targets():
    assert tcp_endpoint("/ip4/198.51.100.7/tcp/4001") == ("198.51.100.7", 4001)
    assert tcp_endpoint("/ip6/2001:db8::1/tcp/4001/p2p/QmPeer") == ("2001:db8::1", 4001)
    for bad in ("/dns4/victim.example/tcp/80", "/ip4/198.51.100.7/tcp/1/p2p/QmRelay/p2p-circuit",
                "/ip4/198.51.100.7/udp/1/quic-v1", "/ip4/0.0.0.0/tcp/1", "/ip4/224.0.0.1/tcp/1",
                "/ip4/255.255.255.255/tcp/1", "/ip4/198.51.100.7/tcp/0", "/ip4/198.51.100.7/tcp/70000",
                "/ip4/999.1.1.1/tcp/1", "/ip4/198.51.100.7/tcp/x", "ip4/198.51.100.7/tcp/1", ""):
        assert tcp_endpoint(bad) is None, bad


def test_a_session_dials_a_few_addresses_on_one_ip_only():
    guard = PunchGuard()
    assert guard.admit("stranger", THIRD_PARTY, 0.0) == []  # no session under way: nothing to dial
    assert guard.may_start("stranger", 0.0)
    kept = guard.admit("stranger", ["/dns4/x.example/tcp/1", *THIRD_PARTY, "/ip4/203.0.113.1/tcp/81"], 0.0)
    assert kept == ["/ip4/203.0.113.1/tcp/80", "/ip4/203.0.113.1/tcp/81"] and len(kept) <= SESSION_ADDRS
    assert guard.may_dial("stranger", "/ip4/203.0.113.1/tcp/80/p2p/QmStranger", 0.0)
    assert not guard.may_dial("stranger", THIRD_PARTY[1], 0.0)  # named, not admitted
    assert not guard.may_dial("other", THIRD_PARTY[0], 0.0)  # admitted for another peer's session
    guard.end("stranger")
    assert not guard.may_dial("stranger", THIRD_PARTY[0], 0.0)  # the session is over


def test_a_crowd_naming_one_victim_gets_few_dials_at_it_over_the_whole_attack():
    """1,000 identities in turn, each with its full budget, all naming the same third-party host over an hour."""
    guard, dials, now = PunchGuard(), 0, 0.0
    for round_ in range(MAX_PUNCH_ATTEMPTS):
        for i in range(1000):
            now += 0.1
            peer = f"id{i}"
            if guard.may_start(peer, now):
                for addr in guard.admit(peer, [f"/ip4/198.51.100.9/tcp/{1000 + round_}", *THIRD_PARTY], now):
                    dials += sum(guard.may_dial(peer, addr, now) for _ in range(3))  # three rounds
                guard.end(peer)
    assert dials <= IP_SESSIONS * SESSION_ADDRS * 3


def test_a_crowd_spending_the_session_rate_leaves_our_own_punches_theirs():
    guard = PunchGuard()
    assert sum(guard.may_start(f"id{i}", 0.0) for i in range(1000)) == SESSIONS_BURST
    for i in range(MAX_PUNCHES_AT_ONCE):
        guard.end(f"id{i}")
    assert guard.may_start("relayed-peer", 0.0, ours=True)


def test_targets_in_one_ipv6_64_share_one_budget():
    guard, admitted = PunchGuard(), 0
    for i in range(4 * IP_SESSIONS):
        now = i / SESSIONS_PER_S
        assert guard.may_start(f"id{i}", now)
        admitted += bool(guard.admit(f"id{i}", [f"/ip6/2001:db8::{i:x}:1/tcp/80"], now))
        guard.end(f"id{i}")
    assert admitted == IP_SESSIONS


def test_punch_dials_keep_a_node_wide_rate_whatever_the_sessions():
    guard, dialed = PunchGuard(), 0
    for second in range(100):
        for i in range(MAX_PUNCHES_AT_ONCE):
            peer = f"s{second}-{i}"
            if guard.may_start(peer, float(second)):
                guard.admit(peer, [f"/ip4/10.0.{second}.{i}/tcp/4001", f"/ip4/10.0.{second}.{i}/tcp/4002"], second)
        for peer in list(guard.punching):
            dialed += sum(guard.may_dial(peer, f"/ip4/{ip}/tcp/4001", float(second))
                          for ip in [f"10.0.{second}.{i}" for i in range(MAX_PUNCHES_AT_ONCE)])
            guard.end(peer)
    assert dialed <= DIALS_BURST + 100 * DIALS_PER_S


def test_the_punch_tables_do_not_grow_with_identities():
    guard = PunchGuard()
    for i in range(3 * PUNCH_MEMORY):
        now = i / SESSIONS_PER_S
        assert guard.may_start(f"id{i}", now)
        guard.admit(f"id{i}", [f"/ip4/10.{i >> 16 & 255}.{i >> 8 & 255}.{i & 255}/tcp/1"], now)
        guard.end(f"id{i}")
    assert guard.remembered() == PUNCH_MEMORY and len(guard._ips) == PUNCH_MEMORY and not guard._admitted


async def test_a_punch_dials_only_admitted_addresses_whatever_the_peer_claimed(autojump_clock):
    """The CONNECT message names third parties and identify holds 300 more claimed addresses: a session dials the
    admitted ones only, each once a round (the swarm's retries would make each dial four connections), its
    unilateral upgrade dials none, and the claims never enter the peerstore."""
    from multiaddr import Multiaddr

    from p2p.reach.punching import GuardedDCUtR

    claimed = [Multiaddr(f"/ip4/192.0.2.{i % 250}/tcp/{1000 + i}") for i in range(300)]
    stored: list = []
    store = SimpleNamespace(addrs=lambda peer: list(claimed), add_addrs=lambda peer, addrs, ttl: stored.append(addrs),
                            peer_info=lambda peer: SimpleNamespace(addrs=[]))
    dialed: list[str] = []

    async def attempt(addr, peer_id, source=None):
        dialed.append(str(addr))
        raise OSError("refused")

    async def dial_with_retries(addr, peer_id, source=None):  # the swarm's dial_addr: three retries more
        for _ in range(4):
            try:
                return await attempt(addr, peer_id, source)
            except OSError:
                pass
        raise OSError("refused four times")

    network = SimpleNamespace(connections={}, dial_addr=dial_with_retries, dial_addr_as_responder=attempt,
                              _dial_addr_single_attempt=attempt)
    host = SimpleNamespace(get_peerstore=lambda: store, get_network=lambda: network, get_addrs=lambda: [])
    guard = PunchGuard()
    dcutr = GuardedDCUtR(host, guard)
    assert host._dcutr_protocol is dcutr  # the host still tells it of disconnections
    assert guard.may_start("stranger", trio.current_time())
    assert not await dcutr._try_unilateral_upgrade("stranger") and dialed == []
    sent = [Multiaddr(a).to_bytes() for a in THIRD_PARTY]
    addrs = dcutr._decode_observed_addrs(sent)
    assert len(addrs) <= MAX_PUNCH_ADDRS
    dcutr.host.get_peerstore().add_addrs("stranger", addrs, 600)
    assert stored == []
    assert not await dcutr._perform_hole_punch("stranger", addrs)  # we answer its session: dial_addr, not as responder
    assert set(dialed) == {THIRD_PARTY[0]} and len(dialed) <= 3  # one address on one IP, three rounds at most


async def test_a_punch_of_ours_put_off_by_the_session_rate_starts_once_the_rate_allows(autojump_clock):
    """The watcher looks at connections again only when they change; a punch the rate put off must not wait for
    that, or a relayed pair that came in with a crowd stays relayed for good."""
    from p2p.reach.probe import ReachConfig
    from p2p.reach.service import _watch

    class Conn:
        muxed_conn = SimpleNamespace(is_initiator=False)  # it dialed us: ours to punch

        def get_transport_addresses(self):
            return ["/ip4/10.0.0.1/tcp/4001/p2p/QmRelay/p2p-circuit"]

    started: list[str] = []

    class Punches:
        async def initiate_hole_punch(self, peer_id):
            started.append(str(peer_id))

    network = SimpleNamespace(connections={"peer": [Conn()]})
    libp2p = SimpleNamespace(get_network=lambda: network, get_id=lambda: "me")
    state = ReachState(Reachability.PUBLIC, relaying=None, dcutr=Punches())
    for i in range(int(SESSIONS_BURST)):  # a crowd spent the rate just now
        assert state.punches.may_start(f"crowd{i}", trio.current_time(), ours=True)
        state.punches.end(f"crowd{i}")
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_watch, state, SimpleNamespace(libp2p=libp2p), ReachConfig(mode="public"), nursery)
        await trio.sleep(1 + 2 / SESSIONS_PER_S)
        nursery.cancel_scope.cancel()
    assert started and set(started) == {"peer"}  # (a punch that fails is tried again, within the peer's budget)
