"""Rollout groups too large for gossip: the codec (inline, compressed, announced, batched; every hostile blob and
batch refused), the blob cache's bounds, and real hosts on loopback where a > 800 KiB group is announced, fetched
and verified, a worker's groups share one message, and a lying or silent announcer is refused and scored down.
Every wait is bounded; no sleeps."""

from __future__ import annotations

import zlib
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, replace
from typing import Any

import blake3
import msgpack
import numpy as np
import pytest
import trio

from p2p.gossip.service import open_gossip
from p2p.host.p2p_host import HostConfig, open_host
from p2p.identity import Identity
from swarm.messages.rollout_codec import (
    Announcement,
    BlobCache,
    RolloutRefused,
    TransportLimits,
    batch_bodies,
    decode_blob,
    open_blob,
    pack_group,
    parse_announcement,
    parse_body,
    parse_items,
)
from swarm.messages.rollout_transport import (
    PROTOCOL,
    FetchConfig,
    publish_groups,
    receive_envelope,
    serve_rollout_blobs,
)
from verify.rollout import Completion, RolloutGroup

RUN = "run-rt"
LIMIT = 30  # seconds per loopback test on a loaded 2-core box; a healthy run takes a few seconds
SMALL = TransportLimits(inline_bytes=4096, max_group_bytes=1 << 20, max_blob_bytes=1 << 20)


def make_group(worker: str, completions: int, tokens: int, seed: int = 0, version: int = 3) -> RolloutGroup:
    """A group shaped like a real one: high-entropy token ids, float32-valued logprobs, 258 proof bytes per 32."""
    rng = np.random.default_rng(seed)

    def completion() -> Completion:
        logprobs = (-rng.exponential(0.5, tokens)).astype(np.float32).astype(float)
        return Completion(tuple(rng.integers(0, 151_000, tokens).tolist()), tuple(logprobs.tolist()), "length",
                          0.0, rng.bytes(258 * max(1, tokens // 32)))

    return RolloutGroup(RUN, version, b"m" * 32, worker, version, "gcd", 7, tuple(range(64)), 0.6, tokens,
                        tuple(completion() for _ in range(completions)))


# ---- codec -------------------------------------------------------------------------------------------------------

def test_each_size_takes_its_form_and_round_trips_to_the_same_rollout():
    tiny = make_group("w", 1, 4)
    plain = pack_group(tiny, limits=replace(SMALL, level=0))  # zlib only stores: compressing does not help
    assert list(plain.body) == ["group"] and plain.blob is None
    assert set(pack_group(tiny, limits=SMALL).body) == {"z", "n"}
    repetitive = replace(make_group("w", 4, 400), completions=tuple(
        Completion((5,) * 400, (-0.5,) * 400, "eos", 1.0, b"") for _ in range(4)))
    compressed = pack_group(repetitive, limits=SMALL)
    assert set(compressed.body) == {"z", "n"} and len(compressed.body["z"]) <= SMALL.inline_bytes
    big = make_group("w", 2, 256)
    announced = pack_group(big, ("/ip4/127.0.0.1/tcp/1/p2p/w", "/ip4/10.0.0.1/tcp/1/p2p/other"), limits=SMALL)
    ann = parse_body(announced.body, SMALL)
    assert isinstance(ann, Announcement) and ann.addrs == ("/ip4/127.0.0.1/tcp/1/p2p/w",)  # never a third party
    assert (ann.blob_id, ann.size) == (blake3.blake3(announced.blob).digest(), len(announced.blob))
    assert (ann.rollout_id, ann.worker, ann.policy_version) == (big.rollout_id(), "w", 3)
    for group, out in ((tiny, plain), (repetitive, compressed)):
        assert parse_body(out.body, SMALL).rollout_id() == group.rollout_id()
    assert open_blob(announced.blob, ann, SMALL) == big


def test_a_blob_that_is_not_what_was_announced_is_refused():
    out = pack_group(make_group("w", 2, 256), limits=SMALL)
    ann = out.announcement
    flipped = bytes([out.blob[0] ^ 1]) + out.blob[1:]
    cases = {
        "hash_mismatch": (flipped, ann),
        "size_mismatch": (out.blob + b"\0", ann),
        "id_mismatch": (out.blob, replace(ann, rollout_id=bytes(32))),
    }
    other = pack_group(make_group("w", 2, 256, seed=1), limits=SMALL)
    cases["id_mismatch"] = (other.blob, replace(other.announcement, rollout_id=ann.rollout_id))
    for reason, (blob, claimed) in cases.items():
        with pytest.raises(RolloutRefused) as caught:
            open_blob(blob, claimed, SMALL)
        assert caught.value.reason == reason and caught.value.hostile


def test_an_announcement_names_its_groups_slot_strictly_and_a_lying_one_is_refused_once_fetched():
    """The announced slot decides which validators fetch the group (verify.votes.assign_validators), so a worker
    could name a slot that draws colluding validators and serve a group of another slot: that is a hostile lie."""
    group = make_group("w", 2, 256)
    out = pack_group(group, limits=SMALL)
    ann = parse_body(out.body, SMALL)
    assert ann.slot() == group.slot() and open_blob(out.blob, ann, SMALL) == group
    lies = {"run": "other-run", "step": 4, "dataset": "sorting", "task_index": 8, "policy_version": 4, "worker": "x"}
    for field, value in lies.items():
        with pytest.raises(RolloutRefused) as caught:
            open_blob(out.blob, replace(ann, **{field: value}), SMALL)
        assert caught.value.reason == "slot_mismatch" and caught.value.hostile, field
    wire = ann.to_wire()  # without its slot, or with anything else, it is refused before fetching
    broken = [{k: v for k, v in wire.items() if k != field} for field in ("run", "step", "dataset", "task")]
    broken += [{**wire, "junk": 1}, {**wire, "step": "3"}, {**wire, "task": -1}, {**wire, "task": True},
               {**wire, "dataset": ""}, {**wire, "run": "r" * 257}, {**wire, "run": b"run"}]
    for body in broken:
        with pytest.raises(RolloutRefused) as caught:
            parse_announcement(body, SMALL)
        assert caught.value.reason == "schema", body


def test_a_zip_bomb_stops_at_its_declared_size_and_oversize_is_refused_before_any_work():
    bomb = zlib.compress(b"\0" * (16 << 20), 9)  # 16 KiB that inflate to 16 MiB
    assert len(bomb) < 20 * 1024
    with pytest.raises(RolloutRefused) as caught:
        decode_blob(bomb, 100_000, SMALL)  # the declared size is what inflation may produce, and no more
    assert caught.value.reason == "bomb"
    with pytest.raises(RolloutRefused) as caught:
        parse_body({"z": bomb, "n": 16 << 20}, SMALL)  # the honest size is above the receiver's bound
    assert caught.value.reason == "oversized"
    with pytest.raises(RolloutRefused) as caught:
        pack_group(make_group("w", 16, 4096), limits=SMALL)  # ~1.4 MB: no receiver would take it
    assert caught.value.reason == "oversized" and not caught.value.hostile
    ann = pack_group(make_group("w", 2, 256), limits=SMALL).announcement.to_wire()
    with pytest.raises(RolloutRefused) as caught:
        parse_announcement({**ann, "size": SMALL.max_blob_bytes + 1}, SMALL)
    assert caught.value.reason == "oversized"


def test_malformed_bodies_fail_the_schema():
    group = make_group("w", 1, 64)
    raw = group.encode()
    padded = msgpack.packb({**group.to_wire(), "junk": b"x" * 100}, use_bin_type=True)
    bodies = [
        None, {}, {"z": "not bytes", "n": 3}, {"z": b"not zlib", "n": 8}, {"group": {"v": 1}},
        {"z": zlib.compress(raw)[:-4], "n": len(raw)},  # truncated stream
        {"z": zlib.compress(raw) + b"tail", "n": len(raw)},  # trailing bytes
        {"z": zlib.compress(raw), "n": len(raw) + 1},  # shorter than declared
        {"z": zlib.compress(padded), "n": len(padded)},  # parses, but is not the canonical encoding of its group
        {"ann": {"id": b"x" * 32}},
        {"ann": {**pack_group(make_group("w", 2, 256), limits=SMALL).announcement.to_wire(), "version": -1}},
    ]
    for body in bodies:
        with pytest.raises(RolloutRefused) as caught:
            parse_body(body, SMALL)
        assert caught.value.reason == "schema", body


def test_blob_cache_forgets_by_age_and_by_bytes_oldest_first():
    cache = BlobCache(max_bytes=100, ttl_s=10.0)
    assert cache.put(b"a", b"1" * 40, now=0.0) and cache.put(b"b", b"2" * 40, now=1.0)
    assert not cache.put(b"huge", b"3" * 101, now=1.0)
    assert cache.put(b"c", b"4" * 40, now=2.0)  # 120 bytes: the oldest goes
    assert (cache.get(b"a", 2.0), cache.get(b"b", 2.0), cache.bytes) == (None, b"2" * 40, 80)
    assert cache.get(b"b", 10.999) == b"2" * 40 and cache.get(b"b", 11.0) is None
    assert cache.get(b"c", 11.0) == b"4" * 40 and cache.get(b"c", 12.0) is None
    assert (len(cache), cache.bytes) == (0, 0)


def test_a_workers_groups_share_messages_up_to_the_inline_limit_and_each_comes_back_out():
    groups = [make_group("w", 1, 4, seed=i) for i in range(12)]
    bodies = [pack_group(g, limits=SMALL).body for g in groups]
    sizes = [len(msgpack.packb(b, use_bin_type=True)) for b in bodies]
    per_message = SMALL.inline_bytes // max(sizes)
    batched = batch_bodies(bodies, SMALL)
    assert 1 < len(batched) < len(bodies) and all(len(msgpack.packb(b)) <= SMALL.inline_bytes + 16 for b in batched)
    assert len(batched[0]["batch"]) >= per_message
    assert [g.rollout_id() for b in batched for g in parse_items(b, SMALL)] == [g.rollout_id() for g in groups]
    assert batch_bodies(bodies[:1], SMALL) == bodies[:1]  # alone: the plain single-group body
    assert batch_bodies([], SMALL) == []


def test_a_hostile_batch_refuses_its_bad_items_alone_or_itself_as_a_whole():
    good = pack_group(make_group("w", 1, 4), limits=SMALL).body
    nested = {"batch": [good]}
    items = parse_items({"batch": [good, {"group": {"junk": 1}}, nested, good]}, SMALL)
    assert [type(i).__name__ for i in items] == ["RolloutGroup", "RolloutRefused", "RolloutRefused", "RolloutGroup"]
    assert items[1].reason == items[2].reason == "schema"
    for whole in ({"batch": []}, {"batch": "x"}, {"batch": [good] * 65}):
        with pytest.raises(RolloutRefused, match="1 to 64 bodies"):
            parse_items(whole, SMALL)
    bomb_parts = [{"z": zlib.compress(b"\0" * 1000), "n": SMALL.max_group_bytes // 2 + 1} for _ in range(2)]
    with pytest.raises(RolloutRefused, match="declares .* inflated bytes") as refused:
        parse_items({"batch": bomb_parts}, SMALL)  # each within the one-group bound, together above it
    assert refused.value.reason == "oversized"
    assert isinstance(parse_items(["not a map"], SMALL)[0], RolloutRefused)  # a single body refused as an item


# ---- real hosts on loopback --------------------------------------------------------------------------------------

@dataclass
class Peer:
    """What receive_envelope and publish_groups use of a swarm node: its host and its gossip."""

    host: Any
    gossip: Any


@asynccontextmanager
async def peers(count: int):
    """`count` hosts with gossip, each connected to peer 0 only (the receiver in these tests)."""
    async with AsyncExitStack() as stack:
        out = []
        for i in range(count):
            host = await stack.enter_async_context(open_host(HostConfig(identity=Identity(bytes([40 + i]) * 32))))
            out.append(Peer(host, await stack.enter_async_context(open_gossip(host, RUN))))
        for other in out[1:]:
            await other.host.connect(out[0].host.multiaddrs[0])
        for other in out[1:]:
            await other.gossip.wait_for_mesh(out[0].host.peer_id, "rollout")
            await out[0].gossip.wait_for_mesh(other.host.peer_id, "rollout")
        yield out


async def test_a_group_above_the_gossip_limit_is_announced_relayed_fetched_and_verified():
    with trio.fail_after(LIMIT):
        async with peers(3) as (hub, worker, receiver):
            inbox = receiver.gossip.subscribe("rollout")
            cache = serve_rollout_blobs(worker.host)
            group = make_group(worker.host.peer_id, 16, 4096)  # ~1.4 MB encoded, ~1 MB compressed
            assert len(group.encode()) > 800 * 1024
            assert worker.host.peer_id not in {str(p) for p in receiver.host.libp2p.get_connected_peers()}
            assert await publish_groups(worker, [group], cache) == ["announced"] and len(cache) == 1
            env = await inbox.receive()  # relayed by the hub: the receiver has no link to the worker yet
            assert len(env.body["ann"]["id"]) == 32 and "group" not in env.body and "z" not in env.body
            served, lookup = [], cache.get
            cache.get = lambda blob_id, now: served.append(blob_id) or lookup(blob_id, now)
            seen = []  # a receiver that does not want the group (not assigned to it) never asks for the blob
            assert await receive_envelope(receiver, env, wanted=lambda ann: seen.append(ann) or False) == []
            assert [a.rollout_id for a in seen] == [group.rollout_id()] and served == []
            refusals: list[str] = []
            [got] = await receive_envelope(receiver, env, refused=refusals.append, wanted=lambda ann: True)
            assert got == group and got.rollout_id() == group.rollout_id() and refusals == [] and len(served) == 1
            assert receiver.gossip.scores.score(worker.host.peer_id, trio.current_time()) == 0


async def test_a_workers_groups_go_out_in_one_message_inline_and_announced_and_all_arrive():
    with trio.fail_after(LIMIT):
        async with peers(2) as (receiver, worker):
            inbox = receiver.gossip.subscribe("rollout")
            cache = serve_rollout_blobs(worker.host)
            me = worker.host.peer_id
            groups = [make_group(me, 1, 4, seed=1), make_group(me, 2, 256, seed=2), make_group(me, 1, 4, seed=3)]
            huge = make_group(me, 16, 4096, seed=4)  # above SMALL's group bound: left out and reported
            skipped = []
            hows = await publish_groups(worker, [groups[0], huge, *groups[1:]], cache, SMALL,
                                        skipped=lambda g, exc: skipped.append((g, exc.reason)))
            assert hows == ["compressed", "announced", "compressed"] and skipped == [(huge, "oversized")]
            env = await inbox.receive()
            assert len(env.body["batch"]) == 3  # one message for the version's groups
            refusals: list[str] = []
            got = await receive_envelope(receiver, env, refusals.append, SMALL, wanted=lambda ann: True)
            assert got == groups and refusals == []


async def test_a_batch_with_another_workers_group_delivers_only_the_senders_own():
    with trio.fail_after(LIMIT):
        async with peers(2) as (receiver, worker):
            inbox = receiver.gossip.subscribe("rollout")
            own = make_group(worker.host.peer_id, 1, 4, seed=1)
            stolen = make_group(receiver.host.peer_id, 1, 4, seed=2)
            body = {"batch": [pack_group(g, limits=SMALL).body for g in (stolen, own)]}
            await worker.gossip.publish("rollout", body)
            refusals: list[str] = []
            assert await receive_envelope(receiver, await inbox.receive(), refusals.append, SMALL) == [own]
            assert refusals == ["worker is not the sender"]


async def test_an_announcer_that_names_another_slot_than_its_group_is_refused_and_scored_down():
    """A group of another slot than announced is a lie caught on fetching (the trainer fetches every group)."""
    with trio.fail_after(LIMIT):
        async with peers(2) as (receiver, liar):
            inbox = receiver.gossip.subscribe("rollout")
            cache = serve_rollout_blobs(liar.host)
            real = pack_group(make_group(liar.host.peer_id, 2, 256), limits=SMALL)
            cache.put(real.announcement.blob_id, real.blob, trio.current_time())
            lying = replace(real.announcement, task_index=real.announcement.task_index + 1)
            await liar.gossip.publish("rollout", {"ann": lying.to_wire()})
            refusals: list[str] = []
            assert await receive_envelope(receiver, await inbox.receive(), refusals.append, SMALL) == []
            assert refusals == ["slot_mismatch"]
            assert receiver.gossip.scores.score(liar.host.peer_id, trio.current_time()) < 0


async def test_a_lying_or_silent_announcer_is_refused_and_scored_down():
    fetch = FetchConfig(attempts=2, base_timeout_s=5.0, backoff_s=0.01)
    with trio.fail_after(LIMIT):
        async with peers(3) as (receiver, liar, other):
            inbox = receiver.gossip.subscribe("rollout")
            cache = serve_rollout_blobs(liar.host)
            honest = pack_group(make_group(liar.host.peer_id, 2, 256), limits=SMALL)
            forged = bytes(len(honest.blob))  # same size, other bytes, stored under the honest id
            cache.put(honest.announcement.blob_id, forged, trio.current_time())
            await liar.gossip.publish("rollout", honest.body)
            refusals: list[str] = []
            assert await receive_envelope(receiver, await inbox.receive(), refusals.append, SMALL, fetch) == []
            assert refusals == ["hash_mismatch"] and receiver.gossip.stats.rejected["malformed"] == 1
            assert receiver.gossip.scores.score(liar.host.peer_id, trio.current_time()) < 0

            # An announcement whose blob its sender no longer holds (expired, evicted): refused at once.
            forgotten = pack_group(make_group(liar.host.peer_id, 2, 256, seed=5), limits=SMALL)
            await liar.gossip.publish("rollout", forgotten.body)
            assert await receive_envelope(receiver, await inbox.receive(), refusals.append, SMALL, fetch) == []
            assert refusals[-1] == "unserved"

            # An announcement its sender never serves (no handler at all): bounded tries, then refused.
            silent = pack_group(make_group(other.host.peer_id, 2, 256, seed=2), limits=SMALL)
            await other.gossip.publish("rollout", silent.body)
            assert await receive_envelope(receiver, await inbox.receive(), refusals.append, SMALL, fetch) == []
            assert refusals[-1] == "unserved"
            score = receiver.gossip.scores.score(other.host.peer_id, trio.current_time())
            assert score < 0

            # One that takes the request and never answers costs the receiver one deadline, not the handler's 120 s.
            other.host.set_guarded_handler(PROTOCOL, lambda stream: trio.sleep_forever(), timeout=None)
            stalling = pack_group(make_group(other.host.peer_id, 2, 256, seed=4), limits=SMALL)
            await other.gossip.publish("rollout", stalling.body)
            env = await inbox.receive()
            started = trio.current_time()
            quick = replace(fetch, base_timeout_s=1.0)
            assert await receive_envelope(receiver, env, refusals.append, SMALL, quick) == []
            assert refusals[-1] == "unserved" and 1.0 <= trio.current_time() - started < 10.0
            assert receiver.gossip.scores.score(other.host.peer_id, trio.current_time()) < score

            # A batch of such announcements costs one deadline, not one per item (64 of them held a receive slot
            # for 40 minutes), and only the first one scores the sender down.
            from swarm.messages.rollout_codec import batch_bodies

            bodies = [pack_group(make_group(other.host.peer_id, 2, 256, seed=10 + i), limits=SMALL).body
                      for i in range(6)]
            (batch,) = batch_bodies(bodies, SMALL)
            await other.gossip.publish("rollout", batch)
            env = await inbox.receive()
            started, before = trio.current_time(), len(refusals)
            assert await receive_envelope(receiver, env, refusals.append, SMALL, quick) == []
            assert refusals[before:] == ["unserved"] * 6 and trio.current_time() - started < 10.0

            # Announcing (or gossiping) another worker's group is refused before anything is fetched.
            stolen = pack_group(make_group(liar.host.peer_id, 2, 256, seed=3), limits=SMALL)
            await other.gossip.publish("rollout", stolen.body)
            assert await receive_envelope(receiver, await inbox.receive(), refusals.append, SMALL, fetch) == []
            assert refusals[-1] == "worker is not the sender"


# ---- many envelopes at once ---------------------------------------------------------------------------------------
