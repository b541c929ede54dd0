"""Connections kept near a bound (p2p.conn_trim): what is closed, in what order, and what never is; then the
host's view of which connections carry more than gossip (P2PHost.peers_in_use) between two real hosts."""

from __future__ import annotations

import pytest
import trio

from p2p.conn_trim import TrimConfig, to_close, track, trim_connections
from p2p.host import open_host

CONFIG = TrimConfig(keep=4, slack=2, grace_s=60.0, every_s=15.0)


def test_nothing_closes_up_to_keep_plus_slack():
    first_seen = {f"p{i}": 0.0 for i in range(6)}
    assert to_close(first_seen, set(), CONFIG, now=1000.0) == []


def test_past_the_bound_the_newest_unused_close_back_to_keep():
    first_seen = {f"p{i}": float(i) for i in range(10)}  # p9 the newest
    closing = to_close(first_seen, in_use={"p8"}, config=CONFIG, now=1000.0)
    assert closing == ["p9", "p7", "p6", "p5", "p4", "p3"]  # 10 - 4, skipping p8 which is in use


def test_connections_in_use_are_never_closed_even_when_that_leaves_too_many():
    first_seen = {f"p{i}": 0.0 for i in range(10)}
    busy = {f"p{i}" for i in range(8)}
    assert sorted(to_close(first_seen, busy, CONFIG, now=1000.0)) == ["p8", "p9"]


def test_young_connections_neither_close_nor_push_older_ones_out():
    old = {f"old{i}": 0.0 for i in range(5)}
    burst = {f"new{i}": 990.0 for i in range(50)}  # a stranger opens 50 connections 10 s ago
    assert to_close({**old, **burst}, set(), CONFIG, now=1000.0) == []
    later = to_close({**old, **burst}, set(), CONFIG, now=1100.0)  # past their grace: they are the newest
    assert len(later) == 51 and all(peer.startswith("new") for peer in later[:50])


def test_track_keeps_first_seen_times_and_forgets_closed_connections():
    assert track({"a": 1.0, "b": 2.0}, ["b", "c"], now=9.0) == {"b": 2.0, "c": 9.0}


def test_config_rejects_nonsense():
    with pytest.raises(ValueError):
        TrimConfig(keep=0)
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


async def test_a_host_counts_a_peer_in_use_while_a_stream_it_opened_is_open():
    async with open_host() as server, open_host() as client:
        opened = trio.Event()
        release = trio.Event()

        async def hold(stream) -> None:
            opened.set()
            await release.wait()

        server.set_guarded_handler("/test/hold/1.0.0", hold, timeout=None)
        await client.connect(server.multiaddrs[0])
        assert server.peer_id not in client.peers_in_use()  # connected, nothing open
        with trio.fail_after(10):
            stream = await client.new_stream(server.peer_id, "/test/hold/1.0.0")
            await opened.wait()
        assert server.peer_id in client.peers_in_use()  # we opened it: in use
        with trio.fail_after(10):  # the server's own streams to the client (identify) end...
            while client.peer_id in server.peers_in_use():
                await trio.sleep(0.05)
        assert not release.is_set() and server.peer_id in client.peers_in_use()  # ...while the held one stays open:
        # a stream a stranger holds open to us keeps nothing
        release.set()
        await stream.close()
        with trio.fail_after(10):
            await client.disconnect(server.peer_id)
            while server.peer_id in client.connected_peers():
                await trio.sleep(0.05)
