"""How a peer chooses a version's data links: how many (its own half at once, then a top-up), to whom (an order of
its own per version, secret, dropped links last), and what others' links and announcements count for."""

from __future__ import annotations

from contextlib import asynccontextmanager

import trio
import trio.testing

from p2p.identity import Identity, peer_id_from_public_bytes
from p2p.pieces.store import PieceStore
from swarm.policy.mirror import PolicyMirror
from swarm.policy.mirror_dial import (
    ANNOUNCE_AGAIN_AFTER,
    RECONCILE_BUSY_S,
    RECONCILE_IDLE_S,
    TOP_UP_AFTER,
    link_order,
)
from swarm.policy.trust import TrainerTrust
from tests.swarm.test_swarm_mirror import signed_version


@asynccontextmanager
async def running_mirror(tmp_path, my_id: str, keep_versions: int | None = None, key: Identity | None = None,
                         **settings):
    """A started mirror of peer `my_id` (PolicyMirror `settings`) following a run of `key` (default: a fresh trainer
    key), with that key and the nursery the mirror runs in."""
    key = key or Identity.generate()
    store_settings = {} if keep_versions is None else {"keep_versions": keep_versions}
    with PieceStore(tmp_path / "store", **store_settings) as store:
        mirror = PolicyMirror(store, my_id, TrainerTrust("r", key.public_bytes, tmp_path), run="r", **settings)
        async with trio.open_nursery() as nursery:
            await nursery.start(mirror.run_service)
            yield mirror, key, nursery


async def test_a_peer_opens_links_per_version_to_a_few_neighbours_drawn_anew_for_each_version(tmp_path, autojump_clock):
    """Linking every version to every neighbour cost each peer in proportion to its neighbours; a peer opens at most
    `links_per_version` links itself, to the neighbours first in an order of the version's own, so the next
    version spreads over others."""
    neighbours = [f"peer-{i:02d}" for i in range(20)]  # each sorts after "me": the links are ours to dial
    # top_up_after 0: every place at once (staging: below)
    async with running_mirror(tmp_path, "me", keep_versions=2, keep=2, links_per_version=3,
                              top_up_after=0.0) as (mirror, key, nursery):
        dialed: list[str] = []

        async def dial(peer):
            dialed.append(peer)
            raise OSError("unreachable")  # reconcile's choice is its `dialing` set until its tasks run

        chosen = []
        for version in (0, 1):
            policy = mirror.adopt(signed_version(tmp_path, key, version))
            await trio.sleep(0.1)  # virtual time: the version's service starts
            await mirror.reconcile(neighbours, dial, max_links=32)
            assert policy.dialing == set(link_order(policy.manifest.id, mirror.outbound.link_salt, neighbours)[:3])
            await mirror.reconcile(neighbours, dial, max_links=32)  # a later round adds none while 3 are open
            assert len(policy.dialing) == 3
            chosen.append(set(policy.dialing))
        assert chosen[0] != chosen[1]
        mirror.outbound.links_per_version = 32
        await mirror.reconcile(neighbours, dial, max_links=5)  # max_peers still bounds every version's links
        assert all(len(p.dialing) == 5 for p in mirror.policies.values())
        nursery.cancel_scope.cancel()


async def test_a_peer_opens_its_own_half_at_once_and_tops_up_only_what_others_links_left_short(tmp_path,
                                                                                                  autojump_clock):
    """Every peer of a run adopts a version within about a second; opening all `links_per_version` places at once,
    before the links others chose to open to it arrived, left each peer with about twice as many links as meant
    (15.7 per version at 64 peers, with 8). A peer opens its own half at once and, TOP_UP_AFTER seconds later, only
    as many more as the links others opened to it meanwhile leave short."""
    neighbours = [f"peer-{i:02d}" for i in range(20)]  # each sorts after "me": the links are ours to dial
    async with running_mirror(tmp_path, "me", links_per_version=6) as (mirror, key, nursery):

        async def dial(peer):
            if peer not in policy.dialing:
                raise OSError("unreachable")  # spares: out of the way of the links
            await trio.sleep_forever()  # a link's dial under way keeps its place

        policy = mirror.adopt(signed_version(tmp_path, key, 0))
        await trio.sleep(0.1)  # virtual time: the version's service starts
        order = link_order(policy.manifest.id, mirror.outbound.link_salt, neighbours)
        await mirror.reconcile(neighbours, dial, max_links=32)
        assert policy.dialing == set(order[:3])  # its own half only
        ours, theirs = trio.testing.memory_stream_pair()  # one neighbour links to us meanwhile
        nursery.start_soon(policy.service.serve_link, "a-neighbour", ours)
        await trio.sleep(TOP_UP_AFTER)
        await mirror.reconcile(neighbours, dial, max_links=32)
        assert policy.service.peers == ["a-neighbour"]
        assert policy.dialing == set(order[:5])  # 3 own + 1 theirs + 2 more = 6
        nursery.cancel_scope.cancel()


def test_a_versions_dropped_links_come_last_in_its_link_order():
    peers = [f"peer-{i:02d}" for i in range(10)]
    order = link_order(b"m" * 32, b"me", peers)
    assert sorted(order) == peers and order != link_order(b"n" * 32, b"me", peers)
    dropped_last = link_order(b"m" * 32, b"me", peers, last={order[0], order[3]})
    assert dropped_last == order[1:3] + order[4:] + [order[0], order[3]]


async def test_a_link_dropped_for_stalling_gives_its_place_to_the_next_neighbour(tmp_path, autojump_clock):
    neighbours = [f"peer-{i:02d}" for i in range(20)]
    async with running_mirror(tmp_path, "me", links_per_version=3, top_up_after=0.0) as (mirror, key, nursery):

        async def dial(peer):
            raise OSError("unreachable")

        policy = mirror.adopt(signed_version(tmp_path, key, 0))
        await trio.sleep(0.1)  # virtual time: the version's service starts
        order = link_order(policy.manifest.id, mirror.outbound.link_salt, neighbours)
        await mirror.reconcile(neighbours, dial, max_links=32)
        assert policy.dialing == set(order[:3])
        await trio.sleep(3.0)  # the failed dials' pause (2 s) is over
        mirror._dropped(policy, order[0], "sent nothing for too long while owing pieces", hostile=False)
        await mirror.reconcile(neighbours, dial, max_links=32)
        assert policy.dialing == set(order[1:4])
        nursery.cancel_scope.cancel()


def test_each_peer_draws_its_own_link_order_so_no_identity_is_everyones_first_choice():
    """An order shared by every peer made the same few neighbours everyone's first links (each taking a link from
    every peer, up to max_peers), and made one identity ground or lucky for a version first for all of them."""
    peers = [f"peer-{i:02d}" for i in range(40)]
    chosen_by = {peer: 0 for peer in peers}
    for chooser in peers:
        for peer in link_order(b"m" * 32, chooser.encode(), [p for p in peers if p != chooser])[:8]:
            chosen_by[peer] += 1
    assert max(chosen_by.values()) < 20  # 8 links each over 40 peers: 8 on average
    firsts = {link_order(b"m" * 32, chooser.encode(), [p for p in peers if p != chooser])[0] for chooser in peers}
    assert len(firsts) > 10


async def test_announcements_waiting_for_an_answer_count_against_links_per_version(tmp_path, autojump_clock):
    """A peer with the larger id opens its links by announcing versions; counting only the links already answered,
    one reconcile announced to every late neighbour at once, however many `links_per_version` allows."""
    neighbours = [f"peer-{i:02d}" for i in range(10)]  # each sorts before "zz": theirs to dial, ours to announce
    async with running_mirror(tmp_path, "zz", links_per_version=3, top_up_after=0.0) as (mirror, key, nursery):

        async def dial(peer):
            await trio.sleep_forever()  # spares kept ahead: not needed here

        silent = []  # the neighbours' ends of our spares: they read the announcement and never answer
        for peer in neighbours:
            ours, theirs = trio.testing.memory_stream_pair()
            mirror.spares._spares[peer] = (ours, trio.current_time() + mirror.spares.ttl)
            silent.append(theirs)
        policy = mirror.adopt(signed_version(tmp_path, key, 0))
        await trio.sleep(2.0)  # past announce_after: nobody dialed its link
        await mirror.reconcile(neighbours, dial, max_links=32)
        await mirror.reconcile(neighbours, dial, max_links=32)
        assert len(policy.announced) == 3 and policy.dialing == set(policy.announced)
        nursery.cancel_scope.cancel()


async def test_links_strangers_open_to_a_peer_never_stop_it_from_choosing_its_own(tmp_path, autojump_clock):
    """Counted against `links_per_version`, links others open would let identities that dial a peer the moment a
    version appears (or hand it the version themselves) take all its places with links that carry nothing: the peer
    opened none, and got the version only if some honest neighbour happened to choose it."""
    neighbours = [f"peer-{i:02d}" for i in range(20)]  # each sorts after "me": the links are ours to dial
    async with running_mirror(tmp_path, "me", links_per_version=4) as (mirror, key, nursery):

        async def dial(peer):
            await trio.sleep_forever()

        policy = mirror.adopt(signed_version(tmp_path, key, 0))
        await trio.sleep(0.1)  # virtual time: the version's service starts
        sybils = []
        for i in range(6):  # silent links in before our first reconcile: smaller identities dial, larger announce
            ours, theirs = trio.testing.memory_stream_pair()
            sybils.append(theirs)
            if i % 2:
                nursery.start_soon(policy.service.serve_link, f"a-sybil-{i}", ours)
            else:
                nursery.start_soon(mirror.inbound._link_over_announcement, f"z-sybil-{i}", ours, policy.manifest.id)
        await trio.sleep(0.1)
        assert len(policy.service.peers) >= mirror.places.stranger_places  # every place strangers may hold is theirs
        await mirror.reconcile(neighbours, dial, max_links=32)
        first_two = link_order(policy.manifest.id, mirror.outbound.link_salt, neighbours)[:2]
        assert policy.dialing == set(first_two)  # half its places
        nursery.cancel_scope.cancel()


def test_a_peers_link_order_is_secret_so_identities_cannot_be_ground_to_come_first_in_it(tmp_path):
    """Drawn from public ids alone, the order a peer links a version in is known to all once the version is out:
    identities ground for it (a few hundred key pairs) and connected before the peer's gossip arrives (seconds
    late under load) would be the peer's own first links. A secret of each process keeps it unknown."""
    key = Identity.generate()
    peers = [f"peer-{i:02d}" for i in range(40)]
    with PieceStore(tmp_path / "store") as store:
        trust = TrainerTrust("r", key.public_bytes, tmp_path)
        one, again = (PolicyMirror(store, "me", trust, run="r") for _ in range(2))  # the same id, restarted
        salt, salt_again = one.outbound.link_salt, again.outbound.link_salt
        assert len(salt) >= 16 and salt != salt_again
        assert link_order(b"m" * 32, salt, peers) != link_order(b"m" * 32, salt_again, peers)


async def test_link_rounds_slow_down_once_every_version_is_complete_here_and_signed_elsewhere(tmp_path,
                                                                                            autojump_clock):
    """Four link rounds a second were the largest single cost of an idle peer; they run that often only while a
    version is being fetched here or was signed here (its links open, top up and replace stalled ones), else every
    2 s, from the moment the last version completes."""
    async with running_mirror(tmp_path, "me") as (mirror, key, nursery):
        assert mirror.reconcile_pause() == RECONCILE_IDLE_S  # nothing to fetch yet
        held = mirror.adopt(signed_version(tmp_path, key, 0), local_dir=tmp_path / "v0")  # complete from the start
        await trio.sleep(0.1)
        assert held.service.completed.is_set()
        assert mirror.reconcile_pause() == RECONCILE_IDLE_S  # a follower holding it: nothing to top up or replace
        fetching = mirror.adopt(signed_version(tmp_path, key, 1))  # others hold its pieces: incomplete here
        await trio.sleep(60)
        assert not fetching.service.completed.is_set()
        assert mirror.reconcile_pause() == RECONCILE_BUSY_S
        nursery.cancel_scope.cancel()
    signer = peer_id_from_public_bytes(key.public_bytes)
    async with running_mirror(tmp_path / "signer", signer, key=key) as (mirror, key, nursery):
        mine = mirror.adopt(signed_version(tmp_path / "signer", key, 0), local_dir=tmp_path / "signer" / "v0")
        await trio.sleep(60)
        assert mine.service.completed.is_set() and mine.origin == mirror.my_id
        assert mirror.reconcile_pause() == RECONCILE_BUSY_S  # the origin keeps its links coming
        nursery.cancel_scope.cancel()


async def test_a_peer_holding_a_version_it_did_not_sign_opens_no_top_up_links(tmp_path, autojump_clock):
    """A top-up link brings its opener more sources; a peer holding every piece needs none (its neighbours still
    fetching top up themselves). With small versions 14 of a peer's 16 link ends per version opened after it held
    the version. Such a peer keeps its own half; the version's origin, the only source at first, tops up."""
    key = Identity.generate()
    origin = peer_id_from_public_bytes(key.public_bytes)
    neighbours = [f"peer-{i:02d}" for i in range(20)]  # each sorts after both ids below: the links are ours to dial
    opened = {}
    for me in ("me", origin):
        async with running_mirror(tmp_path / me, me, key=key, links_per_version=6) as (mirror, _, nursery):

            async def dial(peer):
                if peer not in policy.dialing:
                    raise OSError("unreachable")  # spares: out of the way of the links
                await trio.sleep_forever()  # a link's dial under way keeps its place

            policy = mirror.adopt(signed_version(tmp_path / me, key, 0), local_dir=tmp_path / me / "v0")
            await trio.sleep(0.1)
            assert policy.service.completed.is_set()
            await mirror.reconcile(neighbours, dial, max_links=32)
            assert len(policy.dialing) == 3  # its own half at once, either way
            await trio.sleep(TOP_UP_AFTER)
            await mirror.reconcile(neighbours, dial, max_links=32)
            opened[me] = len(policy.dialing)
            nursery.cancel_scope.cancel()
    assert opened == {"me": 3, origin: 6}


async def test_a_neighbour_that_did_not_take_an_announcement_is_told_again_later_not_at_every_round(tmp_path,
                                                                                                   autojump_clock):
    """A peer reaches smaller neighbours only by announcing versions to them, and peers holding a version open no
    top-ups, so one announcement that found a neighbour without the version (or full) must not be the last; but each
    takes a spare channel, so a neighbour that keeps refusing is told again only every ANNOUNCE_AGAIN_AFTER."""
    async with running_mirror(tmp_path, "zz", links_per_version=2, top_up_after=0.0) as (mirror, key, nursery):
        told: list[float] = []

        async def dial(peer):  # each spare's far end reads the announcement and closes: a refusal
            ours, theirs = trio.testing.memory_stream_pair()

            async def refuse():
                if await theirs.receive_some(65536):
                    told.append(trio.current_time())
                await theirs.aclose()

            nursery.start_soon(refuse)
            return ours

        policy = mirror.adopt(signed_version(tmp_path, key, 0))
        for _ in range(int(4 * 2.5 * ANNOUNCE_AGAIN_AFTER)):  # the node's rounds, four a second while it fetches
            await mirror.reconcile(["peer-00"], dial, max_links=32)
            await trio.sleep(0.25)
        assert not policy.service.completed.is_set()
        assert len(told) == 3  # after announce_after, then once every ANNOUNCE_AGAIN_AFTER
        assert all(ANNOUNCE_AGAIN_AFTER <= b - a < ANNOUNCE_AGAIN_AFTER + 1 for a, b in zip(told, told[1:]))
        nursery.cancel_scope.cancel()
