"""DHT: the pure lookup on an in-memory network, the signed latest-manifest record, and real py-libp2p hosts on
loopback (providers found through a relay, records put by the trainer found, forged ones refused)."""

from __future__ import annotations

import random
from contextlib import AsyncExitStack, asynccontextmanager

import msgpack
import pytest
import trio
import trio.testing
from hypothesis import given, settings
from hypothesis import strategies as st

from p2p.dht.lookup import traverse
from p2p.dht.service import (
    DHT,
    DHTConfig,
    LatestManifest,
    _record_validator,
    best_record,
    latest_manifest_key,
    open_dht,
)
from p2p.errors import DHTError
from p2p.host.p2p_host import HostConfig, open_host
from p2p.identity import Identity

TRAINER = Identity(b"\x07" * 32)
MALLORY = Identity(b"\x66" * 32)
MID1, MID2 = b"\x01" * 32, b"\x02" * 32
LIMIT = 30  # seconds: bound per network test on a loaded 2-core box


# ---- traverse: the lookup with the network injected -----------------------------------------------------------


class FakeNetwork:
    """Peers 0..n-1; each knows `fanout` random others and holds the providers listed in `holdings`."""

    def __init__(self, n: int, fanout: int, holdings: dict[int, list[str]], seed: int = 1) -> None:
        rng = random.Random(seed)
        self.links = {p: rng.sample(range(n), fanout) for p in range(n)}
        self.holdings = holdings
        self.asked: list[int] = []
        self.in_flight = self.max_in_flight = 0
        self.dead: set[int] = set()

    async def ask(self, peer: int) -> tuple[list[str], list[int]]:
        self.asked.append(peer)
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            await trio.sleep(0.01)
            if peer in self.dead:
                raise OSError("unreachable")
            return list(self.holdings.get(peer, [])), self.links[peer]
        finally:
            self.in_flight -= 1


async def test_traverse_finds_items_through_closer_peers(autojump_clock):
    net = FakeNetwork(3, 1, {2: ["provider-x"]})
    net.links = {0: [1], 1: [2], 2: [0]}
    found = await traverse([0], net.ask, enough=lambda items: False, max_queries=10, concurrency=2)
    assert found == ["provider-x"] and net.asked == [0, 1, 2]


async def test_traverse_never_exceeds_its_query_budget_or_concurrency(autojump_clock):
    """No dial storm: a lookup in a 5000-peer network asks at most max_queries peers, concurrency at a time."""
    net = FakeNetwork(5000, 30, {})
    start = trio.current_time()
    found = await traverse(list(range(20)), net.ask, enough=lambda items: False, max_queries=40, concurrency=3)
    assert found == [] and len(net.asked) == 40 and len(set(net.asked)) == 40
    assert net.max_in_flight == 3
    assert trio.current_time() - start == pytest.approx(0.01 * 14)  # ceil(40 / 3) rounds of one query time


async def test_traverse_skips_dead_and_excluded_peers_and_stops_when_enough(autojump_clock):
    net = FakeNetwork(50, 5, {p: [f"prov-{p % 4}"] for p in range(50)})
    net.dead = {0, 1}
    found = await traverse([0, 1, 2, 3], net.ask, enough=lambda items: len(items) >= 2, max_queries=50,
                           concurrency=2, skip={3})
    assert 3 not in net.asked and {0, 1} <= set(net.asked)  # dead peers cost one query each
    assert len(found) >= 2 and len(net.asked) < 10


async def test_traverse_returns_what_it_found_when_time_runs_out(autojump_clock):
    net = FakeNetwork(100, 5, {p: [f"prov-{p}"] for p in range(100)})
    found = await traverse([0], net.ask, enough=lambda items: False, max_queries=100, concurrency=1,
                           timeout=0.035)
    assert found == [f"prov-{p}" for p in net.asked[:3]] and len(net.asked) == 4  # the 4th was cut short


async def test_a_closest_peers_lookup_ends_once_nobody_closer_is_left_to_ask(autojump_clock):
    """Kademlia's end: a lookup for the 20 closest peers stops once the 20 best that answered rank ahead of every
    candidate left, instead of spending its whole budget (40 queries for each provide, put and refresh), and
    finds the same 20 as the lookup that asked all 40."""
    n, rank = 500, lambda p: (p * 2654435761) % 2**32 ^ 0x5A5A5A5A

    def kademlia_like() -> FakeNetwork:
        net = FakeNetwork(n, 60, {})
        net.links = {p: sorted(peers, key=rank)[:20] for p, peers in net.links.items()}  # the 20 it knows closest
        return net

    async def lookup(closest: int) -> tuple[list[int], int]:
        net = kademlia_like()

        async def ask(peer: int) -> tuple[list[int], list[int]]:
            _, closer = await net.ask(peer)
            return [peer], closer

        answered = await traverse(list(range(0, n, 25)), ask, enough=lambda items: False, max_queries=40,
                                  concurrency=3, rank=rank, closest=closest)
        return sorted(answered, key=rank)[:20], len(net.asked)

    full, asked_full = await lookup(closest=0)
    ended, asked_ended = await lookup(closest=20)
    assert asked_full == 40 and asked_ended < 40
    assert ended == full


async def test_traverse_asks_closest_first(autojump_clock):
    net = FakeNetwork(100, 10, {})
    await traverse([50, 10, 90], net.ask, enough=lambda items: False, max_queries=5, concurrency=1,
                   rank=lambda p: abs(p - 42))
    assert net.asked[0] == 50  # the closest start peer goes first, whatever the order given
    assert net.asked[1] == min((p for p in net.links[50] + [10, 90] if p != 50), key=lambda p: abs(p - 42))


# ---- the signed latest-manifest record (pure) ------------------------------------------------------------------


def test_record_round_trip_and_key_binding():
    record = LatestManifest.sign("run-d", MID1, 3, TRAINER)
    assert LatestManifest.decode(record.encode(), latest_manifest_key("run-d", TRAINER.public_bytes)) == record
    assert record.key != latest_manifest_key("run-e", TRAINER.public_bytes)
    assert record.key != latest_manifest_key("run-d", MALLORY.public_bytes)
    with pytest.raises(DHTError, match="does not belong"):
        LatestManifest.decode(record.encode(), latest_manifest_key("run-e", TRAINER.public_bytes))


def test_forged_records_are_refused_by_decode_and_by_the_validator():
    good = LatestManifest.sign("run-d", MID1, 3, TRAINER)
    bumped = LatestManifest(good.run, MID2, 99, good.trainer_key, good.sig)  # same signature, new content
    own_key = LatestManifest.sign("run-d", MID2, 99, MALLORY)  # validly signed, but by the wrong key
    validator = _record_validator()
    for forged, reason in ((bumped, "not signed"), (own_key, "does not belong")):
        with pytest.raises(DHTError, match=reason):
            LatestManifest.decode(forged.encode(), good.key)
        with pytest.raises(DHTError):
            validator.validate(good.key, forged.encode())
    assert validator.select(good.key, [bumped.encode(), good.encode(), own_key.encode()]) == 1


def test_highest_version_wins_everywhere():
    v1, v2 = LatestManifest.sign("r", MID2, 1, TRAINER), LatestManifest.sign("r", MID1, 2, TRAINER)
    tie = LatestManifest.sign("r", MID2, 2, TRAINER)
    assert best_record([v1, v2]) is v2 and best_record([v2, v1]) is v2 and best_record([]) is None
    assert best_record([v2, tie]) is tie and best_record([tie, v2]) is tie  # ties: deterministic by manifest id
    assert _record_validator().select(v1.key, [v1.encode(), v2.encode()]) == 1


@given(st.binary(max_size=300))
@settings(max_examples=200, deadline=None)
def test_fuzz_record_decoder_only_raises_dht_error(data):
    with pytest.raises(DHTError):
        LatestManifest.decode(data)


def test_record_decoder_refuses_wrong_shapes():
    good = LatestManifest.sign("r", MID1, 1, TRAINER)
    items = msgpack.unpackb(good.encode(), raw=False)
    for bad in (items[:4], [*items[:2], -1, *items[3:]], [*items[:1], b"short", *items[2:]], "x" * 2000):
        with pytest.raises(DHTError):
            LatestManifest.decode(msgpack.packb(bad, use_bin_type=True))


# ---- real hosts on loopback --------------------------------------------------------------------------------------

CONFIG = DHTConfig(lookup_timeout_s=5.0)


@asynccontextmanager
async def nodes(count: int):
    """`count` hosts with a DHT each, not yet connected to each other."""
    async with AsyncExitStack() as stack:
        out: list[DHT] = []
        for i in range(count):
            host = await stack.enter_async_context(open_host(HostConfig(identity=Identity(bytes([40 + i]) * 32))))
            out.append(await stack.enter_async_context(open_dht(host, CONFIG)))
        yield out


async def link(left: DHT, right: DHT) -> None:
    await left.host.connect(right.host.multiaddrs[0])


async def test_provider_is_found_through_a_relay_without_duplicates_or_self():
    key = b"\xab" * 32
    with trio.fail_after(LIMIT):
        async with nodes(3) as (a, b, c):
            await link(a, b)
            assert await a.provide(key)  # only b hears it: c is not connected yet
            await a.provide(key)  # announced twice: still one provider record
            await link(c, b)
            assert c.host.libp2p.get_connected_peers() == [b.host.libp2p.get_id()]
            found = await c.find_providers(key)
            assert [p.peer_id for p in found] == [a.host.peer_id]
            assert found[0].multiaddrs and all(m.endswith(f"/p2p/{a.host.peer_id}") for m in found[0].multiaddrs)
            await c.provide(key)
            assert sorted(p.peer_id for p in await c.find_providers(key)) == [a.host.peer_id]  # never ourselves
            assert sorted(p.peer_id for p in await b.find_providers(key)) == sorted([a.host.peer_id, c.host.peer_id])
            assert await c.find_providers(b"\xcd" * 32) == []


async def test_reprovide_reaches_peers_that_joined_later_and_refresh_fills_the_routing_table():
    key = b"\x5a" * 32
    with trio.fail_after(LIMIT):
        async with nodes(2) as (a, b):
            assert not await a.provide(key)  # nobody to tell yet
            assert b.kad.provider_store.get_providers(key) == []
            await link(a, b)
            await a.refresh()
            assert a.kad.get_routing_table_size() == 1
            await a.reprovide()
            await trio.testing.wait_all_tasks_blocked(0.05)  # ADD_PROVIDER has no reply: wait until b is idle
            assert [str(p.peer_id) for p in b.kad.provider_store.get_providers(key)] == [a.host.peer_id]
            a.unprovide(key)
            assert a.provided == []


async def test_latest_manifest_put_by_the_trainer_is_found_and_newer_versions_win():
    with trio.fail_after(LIMIT):
        async with nodes(3) as (trainer, b, c):
            trainer_host_identity = trainer.host.identity
            await link(trainer, b)
            await link(c, b)
            run_key = TRAINER.public_bytes
            await trainer.put_latest_manifest(LatestManifest.sign("run-d", MID1, 1, TRAINER))
            got = await c.get_latest_manifest("run-d", run_key)
            assert (got.manifest_id, got.version) == (MID1, 1)
            v1_bytes = LatestManifest.sign("run-d", MID1, 1, TRAINER).encode()
            await trainer.put_latest_manifest(LatestManifest.sign("run-d", MID2, 2, TRAINER))
            key_bytes = latest_manifest_key("run-d", run_key).encode()
            c.kad.value_store.put(key_bytes, v1_bytes)  # c is stale (it missed the put), yet it finds v2
            got = await c.get_latest_manifest("run-d", run_key)
            assert (got.manifest_id, got.version) == (MID2, 2)
            assert c.kad.value_store.get(key_bytes).value == got.encode()  # and serves v2 from now on
            with pytest.raises(DHTError, match="not newer"):
                await trainer.put_latest_manifest(LatestManifest.sign("run-d", MID1, 1, TRAINER))
            assert await c.get_latest_manifest("run-d", trainer_host_identity.public_bytes) is None
            assert await c.get_latest_manifest("other-run", run_key) is None


async def test_forged_latest_manifest_is_refused_on_put_and_on_get():
    with trio.fail_after(LIMIT):
        async with nodes(3) as (trainer, b, mallory):
            await link(trainer, b)
            await link(mallory, b)
            good = LatestManifest.sign("run-d", MID1, 1, TRAINER)
            await trainer.put_latest_manifest(good)
            forged = LatestManifest(good.run, MID2, 9, good.trainer_key, good.sig)
            with pytest.raises(DHTError):
                await mallory.put_latest_manifest(forged)  # refused locally
            # mallory skips her own checks and writes the forged value straight into b's store, and into her own
            key_bytes = good.key.encode()
            await mallory.kad.value_store._store_at_peer(b.host.libp2p.get_id(), key_bytes, forged.encode())
            mallory.kad.value_store.put(key_bytes, forged.encode())
            assert b.kad.value_store.get(key_bytes).value == good.encode()  # b refused the PUT
            got = await b.get_latest_manifest("run-d", TRAINER.public_bytes)  # b asks mallory too
            assert got == good


async def test_the_maintenance_loop_refreshes_at_start_and_reprovides_on_its_intervals(autojump_clock):
    """Provider records expire unless re-announced: the loop itself (not only a manual call) must keep both
    schedules, each on its own interval."""
    from types import SimpleNamespace

    from p2p.dht.service import DHT, DHTConfig

    host = SimpleNamespace(libp2p=SimpleNamespace(get_id=lambda: "me"))
    dht = DHT(host, kad=None, config=DHTConfig(reprovide_interval_s=100.0, refresh_interval_s=30.0))
    calls = []

    async def refresh():
        calls.append(("refresh", trio.current_time()))

    async def reprovide():
        calls.append(("reprovide", trio.current_time()))

    dht.refresh, dht.reprovide = refresh, reprovide
    with trio.move_on_after(215):
        await dht._maintain()
    assert [t for kind, t in calls if kind == "refresh"] == [0, 30, 60, 90, 120, 150, 180, 210]
    assert [t for kind, t in calls if kind == "reprovide"] == [100, 200]
