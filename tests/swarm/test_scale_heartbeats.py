"""Per-peer heartbeat cost stays flat as the run grows, and what heartbeats feed still works (virtual time)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import trio

from swarm.bench.heartbeat_sim import simulate_heartbeats
from swarm.messages.gossip_bodies import Heartbeat
from swarm.node.gossip import on_heartbeat
from swarm.node.heartbeat_budget import (
    FULL_RATE_COUNTED,
    FULL_RATE_OTHERS,
    MAX_KNOWN_PEERS,
    MAX_STRETCHING_COUNTED,
    heartbeat_stretch,
)
from swarm.node.state import Node

NO_VERSION = SimpleNamespace(latest=lambda: None)


def test_small_runs_keep_the_configured_period_and_large_ones_stretch_it_in_proportion():
    for counted, full_rate in ((True, FULL_RATE_COUNTED), (False, FULL_RATE_OTHERS)):
        assert heartbeat_stretch(0, counted) == heartbeat_stretch(full_rate - 1, counted) == 1.0
        assert heartbeat_stretch(10 * full_rate - 1, counted) == pytest.approx(10.0)
    # a flood of fresh identities stretches heartbeats by a bounded factor only, claimed validators by less
    assert heartbeat_stretch(10**9, False) == heartbeat_stretch(MAX_KNOWN_PEERS, False)
    assert heartbeat_stretch(10**9, True) == heartbeat_stretch(MAX_STRETCHING_COUNTED, True) < 17


def test_the_validators_a_version_names_stretch_the_counted_roles_past_what_claims_may():
    named = 4 * MAX_STRETCHING_COUNTED + 3  # the run's key named 259 validators and the trainer
    assert heartbeat_stretch(10, True, named) == (named + 1) / FULL_RATE_COUNTED > 64
    assert heartbeat_stretch(10**9, True, 3) == heartbeat_stretch(MAX_STRETCHING_COUNTED, True)  # claims: capped
    assert heartbeat_stretch(10, False, named) == heartbeat_stretch(10, False)  # the others' budget is their own
    assert heartbeat_stretch(0, True, 10**9) == (MAX_KNOWN_PEERS + 1) / FULL_RATE_COUNTED  # bounded all the same


def test_a_node_reads_the_named_validators_from_its_newest_version_once_per_version():
    reads = []
    newest = SimpleNamespace(manifest=SimpleNamespace(id=b"v1", model={"run_spec": {"validators": ["ab" * 32] * 3}}))
    mirror = SimpleNamespace(latest=lambda: reads.append(1) or newest)
    node = Node(SimpleNamespace(peer=SimpleNamespace(peer_silence_s=30.0)), None, None, mirror, None, None)
    assert [node.named_counted() for _ in range(3)] == [4, 4, 4]  # three validators and the trainer
    newest.manifest = SimpleNamespace(id=b"v2", model={"run_spec": {"validators": "not a list"}})
    assert node.named_counted() == 1  # a malformed list names no validator
    newest = None
    assert node.named_counted() == 0


@pytest.mark.parametrize("peers", [12, 150, 1000])  # 1,000: 100 validators, more than claims may stretch for
async def test_each_peer_receives_about_the_same_heartbeats_per_second_at_any_size(peers, autojump_clock):
    counts = await simulate_heartbeats(peers, warmup_s=600.0, seconds=1200.0, start_spread_s=20.0,
                                       forget_every_s=2.0 if peers < 500 else 30.0)
    full_rate = (FULL_RATE_COUNTED + FULL_RATE_OTHERS) / 6.0  # what the whole run sends once it is large
    assert counts.received_per_peer_s <= 1.1 * full_rate  # a fixed 6 s period gave 150 / 6 = 25 a second here
    # and nothing heartbeats feed is lost: every peer knows every other, none forgets a live one
    assert counts.known_min == peers - 1 and counts.forgotten_alive == 0
    validators = len([i for i in range(1, peers) if i % 10 == 1])
    assert counts.roles_known_by_trainer == {"validator": validators, "inference": peers - 1 - validators}


async def test_validators_are_forgotten_within_their_own_silence_however_many_others_are_known(autojump_clock):
    node = Node(SimpleNamespace(peer=SimpleNamespace(peer_silence_s=30.0)), None, None, NO_VERSION, None, None)
    others = [f"peer{i}" for i in range(10 * FULL_RATE_OTHERS - 1)]  # a stretch of 10: 300 s
    for peer in others:
        node.heard_from(peer, ("inference",), now=0.0)
    node.heard_from("validator-a", ("validator",), now=0.0)
    node.heard_from("validator-b", ("validator",), now=0.0)
    assert node.forget_silent(29.0) == {}
    node.heard_from("validator-b", ("validator",), now=29.0)
    assert node.forget_silent(31.0) == {"validator-a": ("validator",)}  # one counted peer known: no stretch
    for t in (100.0, 200.0, 290.0):
        node.heard_from("validator-b", ("validator",), now=t)
        assert node.forget_silent(t) == {}  # 290 s of silence is less than 10 stretched 30 s windows
    node.heard_from("validator-b", ("validator",), now=302.0)
    assert node.forget_silent(302.0) == dict.fromkeys(others, ("inference",))


def test_the_peer_tables_are_bounded_and_forget_the_least_recently_heard_first():
    node = Node(SimpleNamespace(peer=SimpleNamespace(peer_silence_s=30.0)), None, None, NO_VERSION, None, None)
    node.heard_from("trainer", ("trainer",), now=0.0)
    for i in range(MAX_KNOWN_PEERS + 10):
        node.heard_from(f"sybil{i}", ("validator",), now=1.0)
        if i == MAX_KNOWN_PEERS // 2:
            node.heard_from("trainer", ("trainer",), now=1.0)  # heard again: it moves to the fresh end
    assert len(node.peer_heard) == len(node.peer_roles) == MAX_KNOWN_PEERS
    assert "trainer" in node.peer_roles and "sybil0" not in node.peer_roles


async def test_a_heartbeat_dials_no_one_once_the_peer_holds_max_peers_connections(autojump_clock):
    started = []
    node = SimpleNamespace(
        peer_id="z" * 52, config=SimpleNamespace(limits=SimpleNamespace(max_peers=2),
                                                  mirror=SimpleNamespace(keep_versions=3)),
        connected_peers=lambda: ["a" * 52, "b" * 52], heard_from=lambda *args: None,
        mirror=SimpleNamespace(latest=lambda: None, policies={}),
        nursery=SimpleNamespace(start_soon=lambda fn, node, part, peer, addrs: started.append(peer)))
    sender = "c" * 52
    heartbeat = Heartbeat((), (f"/ip4/10.0.0.1/tcp/1/p2p/{sender}",), (), ())
    beat = SimpleNamespace(sender_peer_id=sender, decoded=lambda kind: heartbeat if kind is Heartbeat else None)
    on_heartbeat(node, beat, {}, None)
    assert started == []
    node.connected_peers = lambda: ["a" * 52]
    on_heartbeat(node, beat, {}, None)
    assert started == [sender]


async def test_peers_that_start_together_drift_apart_within_the_jitter(autojump_clock):
    """Peers that join together heartbeated in the same second for ever, a burst of floods once a period and
    nothing between; each wait is drawn within HEARTBEAT_JITTER of the period, so their beats spread out."""
    from swarm.node.gossip import HEARTBEAT_JITTER, send_heartbeats

    beats: dict[int, list[float]] = {0: [], 1: []}

    def peer(i: int) -> SimpleNamespace:
        async def publish(kind, body):
            beats[i].append(trio.current_time())
        return SimpleNamespace(gossip=SimpleNamespace(publish=publish), config=SimpleNamespace(
            peer=SimpleNamespace(heartbeat_every_s=6.0, roles=("inference",))), stretch=lambda counted: 10.0,
            mirror=SimpleNamespace(policies={}), host=SimpleNamespace(multiaddrs=[]), progress={})

    with trio.move_on_after(60 * 20):
        async with trio.open_nursery() as nursery:
            for i in beats:
                nursery.start_soon(send_heartbeats, peer(i))
    waits = [b - a for times in beats.values() for a, b in zip(times, times[1:])]
    assert len(waits) >= 30 and all((1 - HEARTBEAT_JITTER) * 60 <= w <= (1 + HEARTBEAT_JITTER) * 60 for w in waits)
    assert abs(sum(waits) / len(waits) - 60) < 4  # the budget holds on average
    assert max(abs(a - b) for a, b in zip(*beats.values())) > 10  # no longer in step
