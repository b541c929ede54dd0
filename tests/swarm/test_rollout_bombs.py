"""Compressed rollout bodies cost a receiver what it would accept, never what they declare: one body is refused
before inflating when it declares more than a receiver accepts inline, a batch stops at its first refused item,
and any number of senders together inflate no more than the node-wide allowance (swarm.messages.gossip_bodies); on
loopback, a bomb is refused by the relay before inflating, never forwarded, and bans its sender."""

from __future__ import annotations

import dataclasses
import gc
import tracemalloc
import zlib
from contextlib import AsyncExitStack
from types import SimpleNamespace

import pytest
import trio

from p2p.errors import EnvelopeError
from p2p.gossip.envelope import seal
from p2p.gossip.service import open_gossip, topic_for
from p2p.host.p2p_host import HostConfig, open_host
from p2p.identity import Identity
from swarm.messages.gossip_bodies import DECODERS, run_decoders
from swarm.messages.rollout_codec import (
    DEFAULT_LIMITS,
    RolloutRefused,
    TransportLimits,
    batch_bodies,
    pack_group,
    parse_items_strictly,
)
from swarm.messages.rollout_transport import items_or_refusal
from verify.rollout import Completion, RolloutGroup

MIB = 1 << 20


def bomb(raw_size: int) -> dict:
    """An inline body whose blob inflates to exactly what it declares: zeros, which then fail the group schema."""
    return {"z": zlib.compress(b"\0" * raw_size, 9), "n": raw_size}


def peak_while(fn) -> int:
    gc.collect()
    tracemalloc.start()
    try:
        fn()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_an_inline_body_declaring_more_than_a_receiver_accepts_inline_is_refused_before_inflating():
    declared = DEFAULT_LIMITS.max_inline_raw_bytes + MIB  # within the largest group, above any inline body
    body = bomb(declared)
    assert len(body["z"]) < 64 * 1024
    outcome: list = []
    peak = peak_while(lambda: outcome.append(items_or_refusal(body)))
    assert peak < MIB
    items, refusal = outcome[0]
    assert items == [] and refusal.reason == "oversized"
    batch = {"batch": [bomb(MIB)] * 5}  # 5 MiB together
    peak = peak_while(lambda: outcome.append(items_or_refusal(batch)))
    assert peak < MIB and outcome[1][1].reason == "oversized"


def test_a_batch_stops_at_its_first_refused_item():
    asked: list[int] = []

    def spend(size: int) -> bool:
        asked.append(size)
        return True

    with pytest.raises(RolloutRefused) as refused:
        parse_items_strictly({"batch": [bomb(MIB)] * 4}, DEFAULT_LIMITS, spend)
    assert refused.value.reason == "schema"
    assert asked == [MIB]  # the second item was never inflated


def test_a_crowd_of_senders_with_one_bomb_each_inflates_no_more_than_the_node_allowance():
    limits = DEFAULT_LIMITS
    clock = [0.0]
    decode = run_decoders(lambda: None, now=lambda: clock[0])["rollout"]
    body = bomb(limits.max_inline_raw_bytes)

    def refusal(i: int) -> str:
        sender = Identity(i.to_bytes(2, "big") * 16)
        with pytest.raises(EnvelopeError) as refused:
            decode(SimpleNamespace(body=body, sender=sender.public_bytes, sender_peer_id=sender.peer_id))
        return refused.value.reason

    reasons = [refusal(i) for i in range(200)]  # 200 fresh identities, each one bomb of the largest size accepted
    inflated = reasons.count("bad_body") * limits.max_inline_raw_bytes
    assert 0 < inflated <= limits.node_inflate_burst_bytes
    assert reasons.count("node_busy") == 200 - reasons.count("bad_body")  # refused unread, costing nobody
    clock[0] = 1.0  # the allowance refills with time, at its rate
    later = [refusal(i) for i in range(200, 400)].count("bad_body") * limits.max_inline_raw_bytes
    assert 0 < later <= limits.node_inflate_bytes_per_s


def repetitive_group(task: int) -> RolloutGroup:
    """A group that compresses about a hundredfold: honest, but it inflates to far more than its blob."""
    tokens = 4096
    completion = Completion((5,) * tokens, (-0.5,) * tokens, "length", 0.0, bytes(258 * (tokens // 32)))
    return RolloutGroup("r", 3, b"\x09" * 32, "w", 3, "gcd", task, (1, 2, 3), 0.6, tokens, (completion,) * 2)


def test_senders_announce_what_receivers_would_refuse_inline_and_batch_within_the_inflated_bound():
    group = repetitive_group(7)
    raw = len(group.encode())
    assert "z" in pack_group(group, limits=TransportLimits(inline_bytes=64 * 1024)).body
    tight = TransportLimits(inline_bytes=64 * 1024, max_inline_raw_bytes=raw - 1)
    assert pack_group(group, limits=tight).announcement is not None  # fits the blob bound, not the inflated one
    roomy = TransportLimits(inline_bytes=64 * 1024, max_inline_raw_bytes=2 * raw)
    bodies = [pack_group(repetitive_group(task), limits=roomy).body for task in range(5)]
    batches = batch_bodies(bodies, roomy)
    assert len(batches) == 3  # two groups per body at most: together they inflate to no more than accepted
    for batch in batches:
        assert len(parse_items_strictly(batch, roomy)) in (1, 2)


def test_a_body_declaring_more_than_accepted_costs_its_sender_even_when_the_node_allowance_would_refuse_it():
    """Declaring more than any receiver accepts is a lie of the sender's, not a busy node: it is refused as such
    before the node-wide allowance is asked."""
    decode = run_decoders(lambda: None, now=lambda: 0.0)["rollout"]
    sender = Identity(bytes([5]) * 32)
    for body in (bomb(DEFAULT_LIMITS.node_inflate_burst_bytes + MIB), {"batch": [bomb(3 * MIB), bomb(3 * MIB)]}):
        with pytest.raises(EnvelopeError) as refused:
            decode(SimpleNamespace(body=body, sender=sender.public_bytes, sender_peer_id=sender.peer_id))
        assert refused.value.reason == "bad_body"


async def test_a_rollout_bomb_on_loopback_is_refused_unread_unforwarded_and_its_sender_banned():
    """Line mallory - target - witness, the target decoding as a node does: bodies of 64 KiB declaring 64 MiB of
    zeros (the largest group) are refused before inflating, never reach the witness, and ban their sender."""
    with trio.fail_after(30):
        async with AsyncExitStack() as stack:
            gossips = []
            for i, decoders in enumerate([DECODERS, run_decoders(lambda: None), DECODERS]):
                host = await stack.enter_async_context(open_host(HostConfig(identity=Identity(bytes([120 + i]) * 32))))
                gossips.append(await stack.enter_async_context(
                    open_gossip(host, "run-bomb", kinds=tuple(DECODERS), decoders=decoders)))
            mallory, target, witness = gossips
            for left, right in ((mallory, target), (target, witness)):
                await left.host.connect(right.host.multiaddrs[0])
                await left.wait_for_mesh(right.host.peer_id, "rollout")
                await right.wait_for_mesh(left.host.peer_id, "rollout")
            heard = witness.subscribe("rollout")
            body = bomb(DEFAULT_LIMITS.max_group_bytes - MIB)
            assert len(body["z"]) < 66 * 1024
            topic = topic_for("run-bomb", "rollout")
            mallory.pubsub.remove_topic_validator(topic)
            bombs = [seal("rollout", "run-bomb", body, mallory.identity, mallory.clock(), seq + 1) for seq in range(5)]
            gc.collect()
            tracemalloc.start()  # every host runs in this process: the peak counts what the target inflated
            try:
                for data in bombs:  # 20 points each: banned at the fourth (scores decay a little meanwhile)
                    await mallory.pubsub.publish(topic, data)
                while mallory.host.peer_id not in target.banned_peers():
                    await trio.sleep(0.05)
                peak = tracemalloc.get_traced_memory()[1]
            finally:
                tracemalloc.stop()
            assert target.stats.rejected["bad_body"] >= 4 and target.stats.delivered == 0
            assert peak < 16 * MIB  # the 63 MiB each bomb declared were never inflated
            with pytest.raises(trio.WouldBlock):
                heard.receive_nowait()


def test_one_sender_of_groups_that_compress_well_takes_only_its_share_of_the_node_inflation_allowance():
    """Honest-looking groups a hundred times smaller compressed: one sender's few messages a second would spend
    the whole node's allowance, and every other worker's compressed groups would be refused as node_busy."""
    limits = DEFAULT_LIMITS
    decode = run_decoders(lambda: None, now=lambda: 0.0)["rollout"]
    hog, honest = Identity(b"\x31" * 32), Identity(b"\x32" * 32)

    def bodies(sender: Identity, first: int, count: int) -> list[dict]:
        groups = [dataclasses.replace(repetitive_group(task), worker=sender.peer_id)
                  for task in range(first, first + count)]
        return batch_bodies([pack_group(g, limits=limits).body for g in groups], limits)

    def outcome(sender: Identity, body: dict) -> str:
        try:
            decode(SimpleNamespace(body=body, sender=sender.public_bytes, sender_peer_id=sender.peer_id))
        except EnvelopeError as refused:
            return refused.reason
        return "decoded"

    hogged = [outcome(hog, body) for body in bodies(hog, 0, 2000)]
    assert "decoded" in hogged and hogged[-1] == "node_busy"
    assert [outcome(honest, body) for body in bodies(honest, 0, 8)] == ["decoded"] * len(bodies(honest, 0, 8))
