"""Connections kept near a bound (p2p.host.conn_trim): what is closed, in what order, and what never is; then the
host's view of which connections carry more than gossip (P2PHost.peers_in_use) between two real hosts."""

from __future__ import annotations

import random
from types import SimpleNamespace

import pytest
import trio

from p2p.host.conn_trim import TrimConfig, keeps_connection, to_close, track, trim_connections
from p2p.host.p2p_host import open_host

CONFIG = TrimConfig(keep=4, slack=2, grace_s=60.0, every_s=15.0)


def close(first_seen, in_use=frozenset(), now=1000.0, seed=0):
    return to_close(first_seen, set(in_use), CONFIG, now, random.Random(seed))


def test_nothing_closes_up_to_keep_plus_slack():
    assert close({f"p{i}": 0.0 for i in range(6)}) == []


def test_past_the_bound_the_excess_closes_but_the_oldest_half_of_the_room_stays():
    first_seen = {f"p{i}": float(i) for i in range(10)}  # p0 the oldest
    closing = close(first_seen, in_use={"p8"})
    assert len(closing) == 6  # 9 unused, room for 4 - 1 in use = 3: back to 4 connections
    assert {"p0", "p8"}.isdisjoint(closing)  # the oldest unused (half the room) and the used one stay


def test_a_crowd_in_use_cannot_squeeze_out_every_other_peer():
    first_seen = {f"p{i}": float(i) for i in range(20)}
    busy = {f"p{i}" for i in range(10, 20)}
    closing = close(first_seen, busy)
    assert len(closing) == 8 and busy.isdisjoint(closing)  # 10 unused keep keep / 2 = 2 places


def test_neither_the_first_to_connect_nor_the_last_hold_the_slots_for_good():
    first_seen = {**{f"early{i}": float(i) for i in range(6)}, **{f"late{i}": 100.0 + i for i in range(6)}}
    closed = {peer for seed in range(50) for peer in close(first_seen, seed=seed)}
    assert "early0" not in closed  # the oldest of the room's half is kept
    assert {f"early{i}" for i in range(1, 6)} & closed and {f"late{i}" for i in range(6)} <= closed


def test_young_connections_neither_close_nor_push_older_ones_out():
    old = {f"old{i}": 0.0 for i in range(5)}
    burst = {f"new{i}": 990.0 for i in range(50)}  # a stranger opens 50 connections 10 s ago
    assert close({**old, **burst}) == []
    later = close({**old, **burst}, now=1100.0)  # past their grace, they count: back to keep
    assert len(later) == 51 and "old0" not in later and "old1" not in later


def test_track_keeps_first_seen_times_and_forgets_closed_connections():
    assert track({"a": 1.0, "b": 2.0}, ["b", "c"], now=9.0) == {"b": 2.0, "c": 9.0}


def test_config_rejects_nonsense():
    with pytest.raises(ValueError):
        TrimConfig(keep=1)
    with pytest.raises(ValueError):
        TrimConfig(every_s=0)


async def test_the_loop_closes_the_excess_once_past_grace(autojump_clock):
    connected = {f"p{i}": True for i in range(12)}
    closed: list[str] = []

    async def disconnect(peer: str) -> None:
        closed.append(peer)
        connected.pop(peer)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(trim_connections, lambda: list(connected), lambda: {"p0", "p1"}, disconnect, CONFIG)
        await trio.sleep(50)
        assert closed == []  # all within their grace period
        await trio.sleep(30)
        assert len(connected) == 4 and {"p0", "p1"} <= set(connected)
        await trio.sleep(300)
        assert len(closed) == 8  # back to keep: nothing more
        nursery.cancel_scope.cancel()


async def test_hosts_count_each_other_in_use_while_a_stream_is_open_and_not_after():
    async with open_host() as server, open_host() as client:
        opened = trio.Event()
        release = trio.Event()

        async def hold(stream) -> None:
            opened.set()
            await release.wait()

        async def until_unused() -> None:
            with trio.fail_after(10):  # identify's streams, or the held one, end
                while server.peer_id in client.peers_in_use() or client.peer_id in server.peers_in_use():
                    await trio.sleep(0.05)

        server.set_guarded_handler("/test/hold/1.0.0", hold, timeout=None)
        await client.connect(server.multiaddrs[0])
        await until_unused()
        with trio.fail_after(10):
            stream = await client.new_stream(server.peer_id, "/test/hold/1.0.0")
            await opened.wait()
        assert server.peer_id in client.peers_in_use() and client.peer_id in server.peers_in_use()
        release.set()
        await stream.close()
        await until_unused()
        with trio.fail_after(10):
            await client.disconnect(server.peer_id)
            while server.peer_id in client.connected_peers():
                await trio.sleep(0.05)


def stream(protocol, opened_by_us, **state):
    muxed = SimpleNamespace(is_initiator=opened_by_us, send_closed=False, recv_closed=False, reset_received=False)
    return SimpleNamespace(get_protocol=lambda: protocol, muxed_stream=SimpleNamespace(**{**vars(muxed), **state}))


def test_which_streams_keep_a_connection():
    assert not keeps_connection(stream("/meshsub/1.2.0", True))  # gossip keeps a stream on every peer
    assert keeps_connection(stream("/ipfs/kad/1.0.0", True)) and not keeps_connection(stream("/ipfs/kad/1.0.0", False))
    assert keeps_connection(stream("/rl-swarm/data/1.0.0", False))  # a link or spare a peer opened to us
    assert not keeps_connection(stream("/rl-swarm/data/1.0.0", True, send_closed=True, recv_closed=True))
    assert not keeps_connection(stream("/rl-swarm/data/1.0.0", True, reset_received=True))
