"""Busy refusals: a loaded uploader answers Reject(BUSY), and its requester asks the piece's other holders, leaves
the busy peer alone for `busy_backoff`, asks it again on the tick after, and never takes BUSY for "lacks the
piece". A peer that answers BUSY forever is bypassed, or dropped by the stall rule when it alone holds a piece. An
uploader whose queue drains within the backoff queues instead of refusing."""

from __future__ import annotations

import random

import pytest
from test_p2p_engine import Sim

from p2p.pieces.engine import BUSY, DropPeer, EngineConfig, Send, SendPiece, SwarmEngine
from p2p.pieces.wire import Reject, Request

STALL = "sent nothing for too long while owing pieces"


def requests_in(actions):
    return [(a.peer, a.message.index) for a in actions if isinstance(a, Send) and isinstance(a.message, Request)]


class AlwaysBusy(SwarmEngine):
    """A hostile holder: it announces every piece and refuses every request as busy."""

    def peer_request(self, peer, index, now):
        return [Send(peer, Reject(index, BUSY))]


def test_a_loaded_uploader_refuses_as_busy_and_a_super_seed_never_does():
    cfg = EngineConfig(upload_slots=1, upload_backlog=1, max_queued_requests=3)
    eng = SwarmEngine(4, b"\x01" * 4, config=cfg)
    eng.peer_connected("x", b"\x00" * 4, 0.0)
    assert eng.peer_request("x", 0, 0.0) == [SendPiece("x", 0)]  # a free slot
    assert eng.peer_request("x", 1, 0.0) == []  # queued: the backlog
    for i in range(5):  # refusals are answered, so an honest peer asking again after its backoff is no flood
        assert eng.peer_request("x", 2, 0.1 + 0.25 * i) == [Send("x", Reject(2, BUSY))]
    assert "x" in eng.peers
    assert eng.upload_done("x", 0, 1.2) == [SendPiece("x", 1)]  # the backlog drains, so the next one queues
    assert eng.peer_request("x", 2, 1.3) == []
    seed = SwarmEngine(4, b"\x01" * 4, config=EngineConfig(upload_slots=1, upload_backlog=0, super_seed=True))
    seed.peer_connected("x", b"\x00" * 4, 0.0)
    for index in range(4):
        seed.peer_have("x", index, 0.0)  # nothing revealed is left unsent; it asks for what it likes
    assert seed.peer_request("x", 0, 0.0) == [SendPiece("x", 0)]
    assert seed.peer_request("x", 1, 0.0) == [] and seed.peer_request("x", 2, 0.0) == []  # queued, not refused


def test_a_requester_that_asks_through_its_busy_refusals_is_dropped_as_a_flood():
    """Refused requests leave the queue, so they are counted per backoff window instead: more than twice the
    pipeline within one backoff is no honest requester, which has at most its pipeline in flight when refused."""
    cfg = EngineConfig(upload_slots=1, upload_backlog=0, pipeline_depth=4, busy_backoff=0.2)  # 8 a window
    eng = SwarmEngine(4, b"\x01" * 4, config=cfg)
    eng.peer_connected("x", b"\x00" * 4, 0.0)
    eng.peer_connected("y", b"\x00" * 4, 0.0)
    assert eng.peer_request("y", 0, 0.0) == [SendPiece("y", 0)]  # the one slot is busy from here on
    for _ in range(8):
        assert eng.peer_request("x", 1, 0.05) == [Send("x", Reject(1, BUSY))]
    assert eng.peer_request("x", 1, 0.3) == [Send("x", Reject(1, BUSY))]  # a new window: counted afresh
    actions = []
    for _ in range(9):
        actions += eng.peer_request("x", 1, 0.35)
    assert any(isinstance(a, DropPeer) and a.peer == "x" for a in actions) and "x" not in eng.peers
    assert "y" in eng.peers


def test_one_requester_cannot_hold_the_backlog_and_with_it_every_freed_slot():
    """While the slots are busy a peer holds at most one backlog place, so another requester still queues and is
    served in turn, however fast the first one asks."""
    eng = SwarmEngine(8, b"\x01" * 8, config=EngineConfig(upload_slots=1, upload_backlog=2))
    for peer in ("hog", "honest"):
        eng.peer_connected(peer, b"\x00" * 8, 0.0)
    assert eng.peer_request("hog", 0, 0.0) == [SendPiece("hog", 0)]
    assert eng.peer_request("hog", 1, 0.0) == []  # its one place in the backlog
    assert eng.peer_request("hog", 2, 0.0) == [Send("hog", Reject(2, BUSY))]
    assert eng.peer_request("honest", 3, 0.0) == []  # queued, not refused
    assert eng.upload_done("hog", 0, 0.1) == [SendPiece("honest", 3)]  # round-robin: the other peer next


def test_a_busy_refusal_sends_the_request_to_another_holder_and_keeps_the_piece_believed_held():
    eng = SwarmEngine(1, b"\x00", config=EngineConfig(endgame=False))
    assert requests_in(eng.peer_connected("a", b"\x01", 0.0)) == [("a", 0)]
    assert requests_in(eng.peer_connected("b", b"\x01", 0.0)) == []  # already asked of a
    assert requests_in(eng.peer_reject("a", 0, 1.0, busy=True)) == [("b", 0)]
    assert eng.peers["a"].bits[0] and eng.availability[0] == 2  # busy is not "lacks the piece"
    assert eng.peer_reject("b", 0, 1.1) == []  # a plain reject: b lacks it after all; a is still backing off
    assert not eng.peers["b"].bits[0] and eng.availability[0] == 1


def test_a_requester_that_backed_off_asks_the_only_holder_again_on_the_tick_after_the_backoff():
    cfg = EngineConfig(busy_backoff=0.5, endgame=False)
    eng = SwarmEngine(1, b"\x00", config=cfg)
    assert requests_in(eng.peer_connected("a", b"\x01", 0.0)) == [("a", 0)]
    assert eng.peer_reject("a", 0, 1.0, busy=True) == []  # nobody else holds it: wait
    assert requests_in(eng.tick(1.4)) == []  # still backing off
    assert eng.peer_have("a", 0, 1.45) == []  # an event inside the backoff asks nothing either
    assert requests_in(eng.tick(1.6)) == [("a", 0)]


def test_a_peer_answering_busy_forever_is_bypassed_when_another_holds_the_pieces():
    sim = Sim(24, ["seed", "liar"], ["p0", "p1", "p2"])
    sim.nodes["liar"] = AlwaysBusy(24, b"\x01" * 24, rng=random.Random(7))
    sim.connect_all()
    sim.run()
    assert sim.completed == {"p0", "p1", "p2"}
    assert not any(peer == "liar" for _, peer, _ in sim.dropped)  # harmless: it holds nothing only it has
    for p in ("p0", "p1", "p2"):
        assert sim.nodes[p].peers["liar"].bits.all()  # its refusals never read as "lacks the piece"


def test_a_peer_answering_busy_forever_as_the_only_holder_ends_in_the_stall_drop():
    cfg = EngineConfig(busy_backoff=0.5, stall_timeout=20.0, request_timeout=5.0, endgame=False)
    eng = SwarmEngine(2, b"\x00\x00", config=cfg, rng=random.Random(1))
    pending = requests_in(eng.peer_connected("liar", b"\x01\x01", 0.0))
    asked, now, dropped_at = 0, 0.0, None
    for _ in range(1_000):  # bounded: 250 s of virtual time
        now += 0.25
        out = []
        for _, index in pending:  # every request is refused as busy a moment later
            out += eng.peer_reject("liar", index, now, busy=True)
        out += eng.tick(now)
        if DropPeer("liar", STALL, hostile=False) in out:
            dropped_at = now
            break
        pending = requests_in(out)
        asked += len(pending)
    assert dropped_at is not None and 20.0 < dropped_at <= 21.0
    assert asked >= 2 * 26  # both pieces every 0.75 s (refused a step after asking, the 0.5 s backoff, asked)


def test_a_busy_peer_is_not_dropped_for_refusing_a_piece_another_holder_served():
    cfg = EngineConfig(busy_backoff=0.5, stall_timeout=20.0, endgame=False)
    eng = SwarmEngine(2, b"\x00\x00", config=cfg, rng=random.Random(2))
    asked = requests_in(eng.peer_connected("a", b"\x01\x01", 0.0))
    eng.peer_connected("b", b"\x01\x01", 0.0)
    out = []
    for _, index in asked:
        out += eng.peer_reject("a", index, 0.1, busy=True)
    assert sorted(requests_in(out)) == [("b", 0), ("b", 1)]
    eng.piece_received("b", 0, True, 1.0)
    eng.piece_received("b", 1, True, 2.0)
    assert eng.complete
    assert not any(isinstance(x, DropPeer) for x in eng.tick(100.0))  # a owes nothing: b served it all


def test_an_uploader_whose_queue_drains_within_the_backoff_queues_instead_of_refusing():
    """A refusal costs its requester the whole backoff; an uploader that sends a piece in a millisecond (uncapped
    loopback) would have served the request many times over by then, so it queues it. A slow one still refuses."""
    cfg = EngineConfig(upload_slots=1, upload_backlog=1, busy_backoff=0.2)
    fast = SwarmEngine(8, b"\x01" * 8, config=cfg)
    fast.peer_connected("x", b"\x00" * 8, 0.0)
    assert fast.peer_request("x", 0, 0.0) == [SendPiece("x", 0)]
    assert fast.peer_request("x", 1, 0.0) == []  # its one backlog place
    assert fast.peer_request("x", 2, 0.0) == [Send("x", Reject(2, BUSY))]  # nothing timed yet: the counts decide
    assert fast.upload_done("x", 0, 0.001) == [SendPiece("x", 1)]  # 1 ms a piece
    assert fast.upload_timer.seconds == pytest.approx(0.001)
    for index in (2, 3, 4):
        assert fast.peer_request("x", index, 0.0015) == []  # three ahead of the last: 3 ms, far within 0.2 s
    assert list(fast.peers["x"].queue) == [2, 3, 4]
    slow = SwarmEngine(8, b"\x01" * 8, config=cfg)
    slow.peer_connected("x", b"\x00" * 8, 0.0)
    slow.peer_request("x", 0, 0.0)
    slow.upload_done("x", 0, 0.25)  # a piece takes longer than the backoff: queueing is worse than a refusal
    assert slow.peer_request("x", 1, 0.25) == [SendPiece("x", 1)]
    assert slow.peer_request("x", 2, 0.25) == []
    assert slow.peer_request("x", 3, 0.25) == [Send("x", Reject(3, BUSY))]


def test_an_abandoned_upload_does_not_count_as_a_fast_one():
    eng = SwarmEngine(4, b"\x01" * 4, config=EngineConfig(upload_slots=1))
    eng.peer_connected("x", b"\x00" * 4, 0.0)
    eng.peer_request("x", 0, 0.0)
    eng.upload_done("x", 0, 0.0001, delivered=False)  # given up at once (corrupt on disk): says nothing of speed
    assert eng.upload_timer.seconds is None


def test_next_retry_is_the_end_of_the_earliest_busy_backoff_and_clears_once_asked_again():
    cfg = EngineConfig(busy_backoff=0.5, endgame=False)
    eng = SwarmEngine(2, b"\x00\x00", config=cfg, rng=random.Random(3))
    assert eng.next_retry() is None
    asked = requests_in(eng.peer_connected("a", b"\x01\x01", 0.0))
    eng.peer_reject("a", asked[0][1], 1.0, busy=True)
    assert eng.next_retry() == 1.5
    assert requests_in(eng.tick(1.5)) == [("a", asked[0][1])]  # the adapter ticks at next_retry: asked at once
    assert eng.next_retry() is None
