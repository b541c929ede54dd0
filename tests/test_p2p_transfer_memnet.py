"""memnet and the token bucket: exact virtual times for caps and latency, fair sharing, backpressure, EOF."""

from __future__ import annotations

import pytest
import trio

from p2p.memnet import MemoryNetwork
from p2p.ratelimit import TokenBucket, acquire_all

MB = 1 << 20


async def drain(stream, into: list):
    while data := await stream.receive_some(1 << 20):
        into.append(data)


async def test_upload_cap_and_latency_give_the_expected_virtual_time(autojump_clock):
    net = MemoryNetwork(latency=0.25)
    net.add_node("a", upload_bps=1 * MB)
    net.add_node("b")
    sa, sb = net.connect("a", "b")
    got: list[bytes] = []
    start = trio.current_time()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(drain, sb, got)
        await sa.send_all(b"x" * (4 * MB))
        await sa.aclose()
    elapsed = trio.current_time() - start
    assert b"".join(got) == b"x" * (4 * MB)
    assert 4.0 + 0.25 <= elapsed <= 4.0 + 0.25 + 0.1  # bytes at 1 MB/s, then one latency, plus the EOF


async def test_links_of_one_node_share_its_upload_fairly(autojump_clock):
    net = MemoryNetwork()
    net.add_node("seed", upload_bps=2 * MB)
    finish = {}
    async with trio.open_nursery() as nursery:
        for name in ("p", "q"):
            net.add_node(name)
            s_out, s_in = net.connect("seed", name)
            got: list[bytes] = []
            nursery.start_soon(drain, s_in, got)

            async def send(s=s_out, n=name):
                await s.send_all(b"y" * (2 * MB))
                finish[n] = trio.current_time()
                await s.aclose()

            nursery.start_soon(send)
    assert finish["p"] == pytest.approx(2.0, abs=0.05) and finish["q"] == pytest.approx(2.0, abs=0.05)


async def test_download_cap_limits_the_receiver(autojump_clock):
    net = MemoryNetwork()
    net.add_node("a")
    net.add_node("b", download_bps=MB // 2)
    sa, sb = net.connect("a", "b")
    got: list[bytes] = []
    async with trio.open_nursery() as nursery:
        nursery.start_soon(drain, sb, got)
        await sa.send_all(b"z" * MB)
        await sa.aclose()
    assert trio.current_time() == pytest.approx(2.0, abs=0.05)


async def test_a_receiver_that_stops_reading_stalls_its_sender(autojump_clock):
    net = MemoryNetwork(window=256 * 1024)
    net.add_node("a")
    net.add_node("b")
    sa, sb = net.connect("a", "b")
    with trio.move_on_after(5) as scope:
        await sa.send_all(b"w" * (4 * MB))
    assert scope.cancelled_caught  # blocked by the window, not buffered without bound
    assert len(await sb.receive_some(64 * 1024)) == 64 * 1024


async def test_closing_one_end_gives_eof_then_broken_sends(autojump_clock):
    net = MemoryNetwork(latency=0.1)
    net.add_node("a")
    net.add_node("b")
    sa, sb = net.connect("a", "b")
    await sa.send_all(b"hello")
    net.nodes["a"].disconnect()
    assert await sb.receive_some(100) == b"hello"
    assert await sb.receive_some(100) == b""
    with pytest.raises(trio.BrokenResourceError):
        await sb.send_all(b"anyone?")
    with pytest.raises(trio.ClosedResourceError):
        await sa.receive_some(10)


async def test_token_bucket_waits_for_the_slower_of_two_caps(autojump_clock):
    fast, slow = TokenBucket(4 * MB, burst=0), TokenBucket(1 * MB, burst=0)
    for _ in range(4):
        await acquire_all([fast, slow], MB // 2)
    assert trio.current_time() == pytest.approx(2.0)  # 2 MB at the slow cap; not 2.5 s (both in turn)


def test_token_bucket_refuses_a_nonpositive_rate():
    with pytest.raises(ValueError):
        TokenBucket(0)


async def test_simulated_broadcast_never_beats_the_physical_bound(tmp_path, autojump_clock):
    from swarm.bench.broadcast_sim import simulate_broadcast
    from tests.test_p2p_transfer import make_policy

    manifest = make_policy(tmp_path / "src", 2 * MB)
    res = await simulate_broadcast(manifest, tmp_path / "src", tmp_path / "work", peers=3,
                                   seed_upload_bps=1 * MB, peer_upload_bps=1 * MB)
    assert set(res.completion_seconds) == {"peer0", "peer1", "peer2"}
    assert res.bound_seconds == pytest.approx(manifest.total_size / MB)  # max(F/U, 3F/(U+3u)) = F/U
    assert 1.0 <= res.ratio < 2.0  # nothing moves faster than the caps allow
    assert res.seed_upload_ratio >= 1.0 and res.to_json()["peers"] == 3


def test_kumar_ross_bound_in_each_regime():
    from swarm.bench.kumar_ross import min_distribution_time

    assert min_distribution_time(100, seed_upload=10, peer_upload=10, num_peers=8) == 10  # seed-bound: F/U
    assert min_distribution_time(100, seed_upload=100, peer_upload=1, num_peers=10) == pytest.approx(1000 / 110)
    assert min_distribution_time(100, seed_upload=100, peer_upload=100, num_peers=2, peer_download=5) == 20
    with pytest.raises(ValueError):
        min_distribution_time(100, seed_upload=0, peer_upload=1, num_peers=1)


@pytest.mark.parametrize("cap", ["node", "per_peer"])
async def test_transfer_upload_caps_hold_on_an_uncapped_network(tmp_path, autojump_clock, cap):
    import random

    from p2p.pieces.store import PieceStore
    from p2p.pieces.transfer import SwarmService, TransferConfig
    from tests.test_p2p_transfer import make_policy

    manifest = make_policy(tmp_path / "src", 2 * MB)
    net = MemoryNetwork()
    net.add_node("seed")
    net.add_node("p0")
    seed_store, peer_store = PieceStore(tmp_path / "seed"), PieceStore(tmp_path / "p0")
    seed_store.add_local_policy(manifest, tmp_path / "src")
    caps = {"node": {"upload_bucket": TokenBucket(MB // 2)},
            "per_peer": {"config": TransferConfig(peer_upload_bps=MB // 2)}}
    seed = SwarmService(manifest, seed_store, **caps[cap])
    peer = SwarmService(manifest, peer_store, rng=random.Random(1))
    async with trio.open_nursery() as nursery:
        await nursery.start(seed.run)
        await nursery.start(peer.run)
        a, b = net.connect("seed", "p0")
        seed.add_link("p0", a)
        peer.add_link("seed", b)
        await peer.completed.wait()
        elapsed = trio.current_time()
        nursery.cancel_scope.cancel()
    expected = manifest.total_size / (MB // 2)
    assert expected - 0.2 <= elapsed <= expected * 1.1  # the cap, not the (infinite) network, sets the pace
    seed_store.close()
    peer_store.close()
