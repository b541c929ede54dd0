"""Who holds a version's link places (swarm.policy.link_places, swarm.policy.served_record): pure decisions."""

from __future__ import annotations

from p2p.pieces.transfer_stats import LinkActivity
from swarm.policy.link_places import FIRST_ASK_WITHIN, LINK_IDLE_AFTER, REFUSED, Admission, admit, choose_order, idle
from swarm.policy.served_record import ServedRecord


def link(opened_at=0.0, active_at=None, greeted=True, offers=False, lacks=True) -> LinkActivity:
    return LinkActivity(opened_at, opened_at if active_at is None else active_at, greeted, offers, lacks)


def test_a_stranger_that_lacks_what_we_hold_and_never_asks_is_idle_after_its_first_seconds():
    squatter = link()
    assert not idle(squatter, FIRST_ASK_WITHIN - 0.1)
    assert idle(squatter, FIRST_ASK_WITHIN)
    assert not idle(squatter, FIRST_ASK_WITHIN, trusted=True)  # it may fetch what we hold elsewhere for now
    assert idle(squatter, LINK_IDLE_AFTER, trusted=True)


def test_a_newcomer_that_asks_keeps_its_place_while_it_asks():
    """An honest peer that just joined holds nothing either: what marks it is that it takes what we hold."""
    newcomer = link(active_at=0.3)
    assert not idle(newcomer, LINK_IDLE_AFTER)
    assert idle(newcomer, 0.3 + LINK_IDLE_AFTER)


def test_a_link_that_claims_pieces_and_delivers_none_is_idle():
    liar = link(offers=True, lacks=False)
    assert not idle(liar, FIRST_ASK_WITHIN)  # we asked it; an honest uploader may take a moment
    assert idle(liar, LINK_IDLE_AFTER)


def test_links_with_nothing_to_carry_or_not_yet_greeted_are_never_idle():
    assert not idle(link(offers=False, lacks=False), 100.0)  # both hold everything: closing it would only reopen it
    assert not idle(link(greeted=False), 100.0)  # its handshake's own timeout bounds it


def test_links_others_open_hold_a_bounded_share_and_a_newcomer_takes_only_the_place_of_a_quiet_one():
    trusted = {"friend"}.__contains__
    young = {f"s{i}": link(opened_at=9.0) for i in range(4)}
    assert admit("new", dict(list(young.items())[:3]), places=4, now=10.0, trusted=trusted) == Admission(True)
    assert admit("new", young, places=4, now=10.0, trusted=trusted) == REFUSED
    quiet = {**young, "s0": link(opened_at=0.0, active_at=1.0), "s1": link(opened_at=0.0, active_at=2.0)}
    assert admit("new", quiet, places=4, now=10.0, trusted=trusted) == Admission(True, evict="s0")


def test_a_trusted_newcomer_takes_the_place_of_an_untrusted_link_that_never_carried_anything():
    trusted = {"friend", "old-friend"}.__contains__
    theirs = {"s0": link(opened_at=9.0), "old-friend": link(opened_at=9.0), "busy": link(opened_at=8.0, active_at=9.5)}
    assert admit("friend", theirs, places=3, now=10.0, trusted=trusted) == Admission(True, evict="s0")
    assert admit("stranger", theirs, places=3, now=10.0, trusted=trusted) == REFUSED
    no_stranger = {"old-friend": link(opened_at=9.0), "busy": link(opened_at=8.0, active_at=9.5)}
    assert admit("friend", no_stranger, places=2, now=10.0, trusted=trusted) == REFUSED


def test_own_links_go_to_trusted_peers_but_one_optimistic_place_and_released_strangers_are_not_tried_again():
    drawn = ["s1", "t1", "s2", "t2", "t3", "s3", "origin"]
    trusted = {"t1", "t2", "t3", "origin"}.__contains__
    assert choose_order(drawn, trusted, 4)[:4] == ["t1", "t2", "t3", "s1"]
    assert choose_order(drawn, trusted, 1)[0] == "t1"  # a single place goes to a trusted peer
    order = choose_order(drawn, trusted, 4, last={"t1"}, released={"s1", "origin"})
    assert order == ["t2", "t3", "s2", "s3", "t1", "origin"]  # a released trusted peer is tried again, last


def test_own_places_go_to_the_peers_that_did_most_for_us_when_a_crowd_bought_trust_cheaply():
    """A piece taken buys trust; a crowd of identities that each took one must not fill the trusted places ahead of
    the peers that served us or fetched the version from us."""
    record = ServedRecord()
    crowd = [f"s{i}" for i in range(50)]
    for peer in crowd:
        record.note(peer, served=0, took=1)
    record.note("server", served=5, took=0)
    record.note("follower", served=0, took=12)
    drawn = crowd + ["follower", "server", "stranger"]
    order = choose_order(drawn, record.trusted, 4, rank=record.score)
    assert order[:4] == ["server", "follower", "s0", "stranger"]  # the optimistic place: a stranger


def test_trust_is_earned_by_pieces_moved_forgotten_on_demand_and_bounded_for_any_number_of_identities():
    record = ServedRecord(took_for_trust=2, max_remembered=3)
    record.note("server", served=1, took=0)
    record.note("taker", served=0, took=1)
    record.note("nobody", served=0, took=0)
    assert record.trusted("server") and not record.trusted("taker") and len(record) == 2
    record.note("taker", served=0, took=2)
    assert record.trusted("taker")
    record.forget("taker")
    assert not record.trusted("taker")
    for i in range(1000):
        record.note(f"sybil-{i}", served=1, took=0)
    assert len(record) == 3 and not record.trusted("server")
