"""A version's link places in a running mirror, on a virtual clock: links others open hold a bounded share, a link
that takes a place and carries nothing gives it up, and a newcomer that asks for pieces keeps its place."""

from __future__ import annotations

import trio
import trio.testing

from p2p.pieces.wire import Hello, Request, message_frame, pack_bits, send_buffers
from swarm.policy.link_places import FIRST_ASK_WITHIN
from swarm.policy.mirror import MAX_BANNED
from swarm.policy.mirror_places import MAX_RELEASED, TEND_EVERY
from tests.swarm.test_swarm_mirror import signed_version
from tests.swarm.test_swarm_mirror_links import running_mirror


async def open_link(nursery, mirror, policy, peer: str, asks: bool = False):
    """A link `peer` opens to the mirror for `policy`: its hello claims no piece; it asks for every piece if `asks`,
    else for nothing. Returns its end of the channel."""
    ours, theirs = trio.testing.memory_stream_pair()
    nursery.start_soon(mirror.inbound.route, peer, ours, policy.manifest.id, b"", 0.0)
    n = policy.manifest.num_pieces
    await send_buffers(theirs, message_frame(Hello(policy.manifest.id, pack_bits(bytes(n)))))
    if asks:
        for index in range(n):
            await send_buffers(theirs, message_frame(Request(index)))

    async def drain():
        try:
            while await theirs.receive_some(1 << 16):
                pass
        except trio.BrokenResourceError:
            pass

    nursery.start_soon(drain)
    return theirs


async def rounds(mirror, seconds: float) -> None:
    """The node's link rounds (they also look after the places) for `seconds` of virtual time."""
    async def dial(peer):
        raise OSError("no dials here")

    for _ in range(int(seconds / 0.25)):
        await mirror.reconcile([], dial, max_links=64)
        await trio.sleep(0.25)


async def test_squatters_hold_a_bounded_share_of_places_give_them_up_and_do_not_come_back(tmp_path, autojump_clock):
    async with running_mirror(tmp_path, "me", links_per_version=8) as (mirror, key, nursery):
        policy = mirror.adopt(signed_version(tmp_path, key, 0), local_dir=tmp_path / "v0")  # a seed of it
        await trio.sleep(0.1)
        squatters = [f"a-squatter-{i}" for i in range(6)]  # smaller ids than "me": their links are theirs to dial
        for peer in squatters:
            await open_link(nursery, mirror, policy, peer)
        await trio.sleep(0.1)
        assert len(policy.service.peers) == mirror.places.stranger_places == 4
        await rounds(mirror, FIRST_ASK_WITHIN + TEND_EVERY)
        assert policy.service.peers == [] and policy.released == set(squatters[:4])
        await open_link(nursery, mirror, policy, squatters[0])  # once idle, never admitted again for this version
        await open_link(nursery, mirror, policy, "a-newcomer", asks=True)
        await trio.sleep(0.1)
        await rounds(mirror, 3 * FIRST_ASK_WITHIN)
        assert policy.service.peers == ["a-newcomer"]  # it asked, got the version, and keeps its place
        assert policy.service.stats["a-newcomer"].pieces_up == policy.manifest.num_pieces
        nursery.cancel_scope.cancel()


async def test_a_peer_that_served_us_before_takes_the_place_of_a_squatter(tmp_path, autojump_clock):
    async with running_mirror(tmp_path, "me", links_per_version=2) as (mirror, key, nursery):
        policy = mirror.adopt(signed_version(tmp_path, key, 0))  # fetching: every link holds what we lack
        await trio.sleep(0.1)
        await open_link(nursery, mirror, policy, "a-squatter")
        await trio.sleep(0.1)
        assert policy.service.peers == ["a-squatter"]  # one place for strangers (half of 2)
        await open_link(nursery, mirror, policy, "a-stranger")
        await trio.sleep(0.1)
        assert policy.service.peers == ["a-squatter"]  # refused: the squatter's link is young
        mirror.places.served.note("a-friend", served=3, took=0)
        await open_link(nursery, mirror, policy, "a-friend")
        await trio.sleep(0.1)
        assert policy.service.peers == ["a-friend"] and "a-squatter" in policy.released
        nursery.cancel_scope.cancel()


async def test_what_a_version_remembers_of_released_and_dropped_peers_is_bounded_for_any_number_of_identities(
        tmp_path, autojump_clock):
    async with running_mirror(tmp_path, "me") as (mirror, key, nursery):
        policy = mirror.adopt(signed_version(tmp_path, key, 0))
        await trio.sleep(0.1)
        for i in range(MAX_RELEASED + 100):
            mirror._dropped(policy, f"sybil-{i}", "carried nothing it could have carried", hostile=False)
        assert len(policy.dropped) <= MAX_RELEASED and len(mirror._gone) <= MAX_BANNED
        nursery.cancel_scope.cancel()


async def test_asking_for_pieces_we_lack_is_no_activity(tmp_path, autojump_clock):
    """A request keeps a link busy only when it asks for a piece we hold: one for a piece we lack costs its sender
    nothing, and a squatter sending one every few seconds would keep its place for ever."""
    async with running_mirror(tmp_path, "me") as (mirror, key, nursery):
        policy = mirror.adopt(signed_version(tmp_path, key, 0))  # fetching: it holds no piece yet
        await trio.sleep(0.1)
        faker = await open_link(nursery, mirror, policy, "a-faker")
        await trio.sleep(1.0)
        for index in range(policy.manifest.num_pieces):
            await send_buffers(faker, message_frame(Request(index)))
        await trio.sleep(1.0)
        activity = policy.service.activity("a-faker")
        assert activity is not None and activity.active_at == activity.opened_at
        nursery.cancel_scope.cancel()
