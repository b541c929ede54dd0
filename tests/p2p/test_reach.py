"""Reachability on loopback: the dial-back verdict, relayed connections between private peers, relay limits.

The same over real network stacks (firewalls, NAT, hole punching) is tests/p2p/test_reach_netns.py.
"""

from __future__ import annotations

import functools

import pytest
import trio

from p2p.errors import HostError
from p2p.host.p2p_host import HostConfig, open_host
from p2p.reach.probe import (
    MAX_PUNCH_ATTEMPTS,
    MAX_PUNCHES_AT_ONCE,
    Reachability,
    ReachConfig,
    decode_port,
    probe_listener,
    punch_targets,
    verdict,
)
from p2p.reach.relay import Relaying, RelayLimits, _bucket, _PacedStream
from p2p.reach.service import ReachState, _watch

ECHO = "/test/echo/1"


def test_one_yes_makes_a_peer_public_and_only_noes_make_it_private():
    assert verdict([False, True, None]) is Reachability.PUBLIC
    assert verdict([False, None]) is Reachability.PRIVATE
    assert verdict([None, None]) is Reachability.UNKNOWN
    assert verdict([]) is Reachability.UNKNOWN


def test_a_dial_back_request_is_two_bytes_naming_a_real_port():
    assert decode_port(b"\x0f\xa1") == 4001
    for bad in (b"", b"\x00\x00", b"\x01\x02\x03"):
        with pytest.raises(HostError):
            decode_port(bad)


def test_only_the_end_a_relayed_connection_was_dialed_to_starts_a_hole_punch():
    links = {"dialed_us": [(True, False)], "we_dialed": [(True, True)], "direct": [(False, False)],
             "punched_too": [(True, False), (False, False)], "busy": [(True, False)], "tried": [(True, False)],
             "tried_less": [(True, False)], "gone": [], "a_both_ways": [(True, True), (True, False)],
             "z_both_ways": [(True, False), (True, True)]}
    attempts = {"tried": MAX_PUNCH_ATTEMPTS, "tried_less": MAX_PUNCH_ATTEMPTS - 1}
    assert punch_targets("m", links, {"busy"}, attempts) == ["dialed_us", "tried_less", "z_both_ways"]
    assert punch_targets("z", {"m": [(True, True), (True, False)]}, set(), {}) == []  # "m" punches toward "z"
    crowd = {f"stranger{i}": [(True, False)] for i in range(3 * MAX_PUNCHES_AT_ONCE)}
    assert len(punch_targets("m", crowd, {"busy"}, {})) == MAX_PUNCHES_AT_ONCE - 1  # identities are free


def test_configs_refuse_nonsense_in_one_sentence():
    with pytest.raises(HostError, match="auto, public or private"):
        ReachConfig(mode="sometimes")
    with pytest.raises(HostError, match="at least 1"):
        RelayLimits(max_reservations=0)
    with pytest.raises(HostError, match="bandwidth"):
        RelayLimits(circuit_mbps=-1)
    assert RelayLimits(circuit_mbps=8).circuit_bytes_per_s == 1e6


async def test_a_relay_paces_what_it_forwards(autojump_clock):
    written = []

    class Sink:
        async def write(self, data):
            written.append((trio.current_time(), len(data)))

    paced = _PacedStream(Sink(), [_bucket(8.0), _bucket(0)])  # 1 MB/s per circuit, no total cap
    start = trio.current_time()
    for _ in range(5):
        await paced.write(b"x" * 1_000_000)
    assert trio.current_time() - start == pytest.approx(5.0)  # 5 MB at 1 MB/s: the relay holds each back


async def test_a_port_without_a_libp2p_listener_is_not_reachable():
    async def silent(stream):
        await stream.send_all(b"HTTP/1.1 400 Bad Request\r\n\r\n")

    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(functools.partial(trio.serve_tcp, silent, 0, host="127.0.0.1"))
        port = listeners[0].socket.getsockname()[1]
        assert not await probe_listener("127.0.0.1", port, 2.0)
        nursery.cancel_scope.cancel()


async def test_a_host_on_loopback_is_told_it_is_public_by_its_bootstrap_peer():
    async with open_host(HostConfig()) as first:
        assert first.reach.status is Reachability.UNKNOWN  # nobody to ask: it serves as a relay anyway
        async with open_host(HostConfig(bootstrap=(first.multiaddrs[0],))) as second:
            assert second.reach.status is Reachability.PUBLIC
            assert "/p2p-circuit" not in second.multiaddrs[0]


async def _echo(stream):
    data = await stream.read(64)
    await stream.write(data[::-1])
    await stream.close()


async def test_private_peers_announce_relayed_addresses_and_are_dialed_through_them():
    async with open_host(HostConfig()) as relay:
        private = HostConfig(bootstrap=(relay.multiaddrs[0],), reach=ReachConfig(mode="private", hole_punch=False))
        async with open_host(private) as a, open_host(private) as b:
            assert b.multiaddrs == [f"{relay.multiaddrs[0]}/p2p-circuit/p2p/{b.peer_id}"]
            b.set_guarded_handler(ECHO, _echo)
            assert await a.connect(b.multiaddrs[0]) == b.peer_id
            stream = await a.new_stream(b.peer_id, ECHO)
            await stream.write(b"through the relay")
            assert await stream.read(64) == b"yaler eht hguorht"
            assert a.reach.kinds(a.libp2p)[b.peer_id] == "relayed"
            assert a.reach.kinds(a.libp2p)[relay.peer_id] == "direct"


async def test_a_relay_that_does_not_serve_grants_no_reservation():
    no_relay = ReachConfig(relay=RelayLimits(serve=False))
    async with open_host(HostConfig(reach=no_relay)) as public:
        private = HostConfig(bootstrap=(public.multiaddrs[0],), reach=ReachConfig(mode="private", hole_punch=False))
        async with open_host(private) as a:
            assert a.reach.relayed_addrs == []


async def test_a_data_channel_to_a_relayed_peer_takes_the_libp2p_stream_without_trying_a_socket():
    from p2p.channel.addresses import socket_reachable
    from p2p.channel.service import open_data_channel, serve_data_channels

    received = []

    async def keep(peer, channel):
        received.append(await channel.receive_some(64))

    async with open_host(HostConfig()) as relay:
        private = HostConfig(bootstrap=(relay.multiaddrs[0],), reach=ReachConfig(mode="private", hole_punch=False))
        async with open_host(private) as a, open_host(private) as b, trio.open_nursery() as nursery:
            await nursery.start(serve_data_channels, b, keep)
            await nursery.start(serve_data_channels, relay, keep)
            await a.connect(b.multiaddrs[0])
            assert not socket_reachable(a, b.peer_id)  # no socket tried: its address would be the relay's
            assert socket_reachable(a, relay.peer_id)
            channel = await open_data_channel(a, b.peer_id)
            assert channel.transport == "libp2p-stream"
            await channel.send_all(b"piece bytes")
            await channel.aclose()
            direct = await open_data_channel(a, relay.peer_id)
            assert direct.transport == "data-socket"
            await direct.aclose()
            with trio.fail_after(5):
                while len(received) < 2:
                    await trio.sleep(0.05)
            assert b"piece bytes" in received
            nursery.cancel_scope.cancel()


async def test_no_data_socket_is_tried_over_a_hole_punched_connection():
    from p2p.channel.addresses import socket_reachable

    class Reach:
        def __init__(self, kind):
            self.kind = kind

        def kinds(self, libp2p):
            return {"peer": self.kind}

    class Host:
        libp2p = None
        peer_id = "me"

        def __init__(self, kind):
            self.reach = Reach(kind)

    assert socket_reachable(Host("direct"), "peer")
    assert not socket_reachable(Host("hole-punched"), "peer")  # the NAT opened libp2p's port, not the data port
    assert not socket_reachable(Host("relayed"), "peer")


async def test_a_peer_whose_bootstrap_peer_came_up_late_asks_again_once_connected():
    from p2p.identity import Identity
    from p2p.reach.service import _listen_port

    async with open_host(HostConfig()) as probe:
        port = _listen_port(probe)  # a free port, released when the probe closes
    relay_identity = Identity.generate()
    relay_addr = f"/ip4/127.0.0.1/tcp/{port}/p2p/{relay_identity.peer_id}"
    late = HostConfig(bootstrap=(relay_addr,), dial_timeout=2, reach=ReachConfig(recheck_s=0.2))
    async with open_host(late) as peer:
        assert peer.reach.status is Reachability.UNKNOWN  # nobody to ask
        async with open_host(HostConfig(identity=relay_identity, listen=(f"/ip4/127.0.0.1/tcp/{port}",))):
            await peer.redial(relay_addr)
            with trio.fail_after(10):
                while peer.reach.status is Reachability.UNKNOWN:
                    await trio.sleep(0.1)
            assert peer.reach.status is Reachability.PUBLIC


async def test_a_peer_whose_data_socket_failed_is_not_tried_again_for_a_while(autojump_clock):
    from p2p.channel.addresses import UNREACHABLE_FOR_S, note_socket_unreachable, socket_reachable

    class Host:
        peer_id = "me"

    note_socket_unreachable(Host(), "private-peer")
    assert not socket_reachable(Host(), "private-peer")  # no second connect timeout for each channel
    assert socket_reachable(Host(), "another-peer")
    await trio.sleep(UNREACHABLE_FOR_S + 1)
    assert socket_reachable(Host(), "private-peer")  # tried again: it may have opened a port since


async def test_a_server_out_of_dial_backs_refuses_without_calling_the_asker_private():
    from p2p.reach.probe import ask_dial_back
    from p2p.reach.service import _listen_port

    async with open_host(HostConfig(reach=ReachConfig(dial_backs_per_s=0.001))) as server, \
            open_host(HostConfig(bootstrap=(server.multiaddrs[0],))) as asker:
        port = _listen_port(asker)
        answers = [await ask_dial_back(asker, server.peer_id, port, 5.0) for _ in range(7)]  # the rest of the burst
        assert answers == [True] * 7  # the asker's own start-up check took the first
        assert await ask_dial_back(asker, server.peer_id, port, 5.0) is None  # refused: no verdict, not "private"


def test_a_connections_kind_is_worked_out_once_and_one_with_no_address_yet_is_asked_again():
    """The reach service asks every connection's kind each second: its multiaddrs are formatted once."""
    from p2p.reach.relay_limits import connection_kind

    class Conn:
        def __init__(self, addrs):
            self.addrs, self.asked = addrs, 0

        def get_transport_addresses(self):
            self.asked += 1
            return self.addrs

    relayed, direct = Conn(["/ip4/1.2.3.4/tcp/1/p2p/QmRelay/p2p-circuit"]), Conn(["/ip4/1.2.3.4/tcp/1"])
    fresh = Conn([])
    assert [connection_kind(relayed) for _ in range(3)] == ["relayed"] * 3 and relayed.asked == 1
    assert [connection_kind(direct) for _ in range(3)] == ["direct"] * 3 and direct.asked == 1
    assert connection_kind(fresh) == "direct"
    fresh.addrs = ["/ip4/5.6.7.8/tcp/2/p2p/QmRelay/p2p-circuit"]  # its addresses came: now it is known relayed
    assert connection_kind(fresh) == "relayed" and connection_kind(fresh) == "relayed" and fresh.asked == 2


class _Conn:
    """A connection as the reach watcher sees it: its transport addresses, which may show up late."""

    def __init__(self, addrs: list[str]) -> None:
        self.addrs = addrs

    def get_transport_addresses(self) -> list[str]:
        return self.addrs


class _Network:
    def __init__(self, connections: dict) -> None:
        self.connections = connections


class _Libp2p:
    def __init__(self, connections: dict) -> None:
        self._network = _Network(connections)

    def get_network(self) -> _Network:
        return self._network


async def test_the_reach_watcher_looks_again_only_when_connections_change_or_a_kind_was_unsettled(autojump_clock):
    """A watch round that finds the connections of the last one skips listing them (half a millisecond a second of
    an idle peer); a connection that showed no address yet was judged direct for the moment, so it is looked at
    again until it does, and a relayed one is noted once its circuit address shows."""
    late = _Conn([])  # no address yet: "direct" for now, not settled
    libp2p = _Libp2p({"peer-a": _Conn(["/ip4/10.0.0.1/tcp/4001"]), "peer-b": late})
    state = ReachState(Reachability.PUBLIC, Relaying(None, None))
    noted: list[int] = []
    note = state.note_relayed
    state.note_relayed = lambda host: noted.append(1) or note(host)
    host = type("Host", (), {"libp2p": libp2p})()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_watch, state, host, ReachConfig(mode="public"), nursery)
        await trio.sleep(3.5)
        assert len(noted) == 4 and "peer-b" not in state.ever_relayed  # unsettled: every round looks again
        late.addrs = ["/ip4/10.0.0.9/tcp/4001/p2p/QmRelay/p2p-circuit"]
        await trio.sleep(1)
        assert "peer-b" in state.ever_relayed
        rounds = len(noted)
        await trio.sleep(10)
        assert len(noted) == rounds  # everything settled and unchanged: nothing to look at
        libp2p.get_network().connections["peer-c"] = _Conn(["/ip4/10.0.0.3/tcp/4001"])
        await trio.sleep(1)
        assert len(noted) == rounds + 1
        nursery.cancel_scope.cancel()
