"""The sans-IO swarm engine, driven by a pure message-passing simulation (no IO; a fake clock that steps per
message and jumps a tick whenever nothing is in flight, as the transfer service's ticker re-drives a quiet engine).

Every action any engine emits is checked against the invariants: never request a piece we hold, never from a
peer that does not hold it, never past the pipeline depth, never announce a piece before it was stored; a
super-seed never sends a piece twice while another piece has never been sent. The rarest-first engine and the
naive reference picker must complete the same swarms.
"""

from __future__ import annotations

import random
from collections import deque

import pytest

from p2p.pieces.engine import BUSY, Completed, DropPeer, EngineConfig, Send, SendPiece, StorePiece, SwarmEngine
from p2p.pieces.picker import NaivePicker, RarestFirstPicker
from p2p.pieces.wire import Cancel, Have, Reject, Request


class Sim:
    """Engines exchanging messages through one FIFO queue; `corrupt` nodes serve bad bytes. When the queue runs dry
    the clock jumps `tick_interval` and every engine ticks (a requester backing off from a busy peer asks again
    only then); the run ends at the first tick that sends nothing, so no run loops forever."""

    tick_interval = 1.0  # as p2p/pieces/transfer.py's TransferConfig.tick_interval

    def __init__(self, num_pieces, seeds, leeches, config=EngineConfig(), picker=None, corrupt=(), seed_config=None):
        self.n = num_pieces
        self.config = config
        self.nodes: dict[str, SwarmEngine] = {}
        self.corrupt = set(corrupt)
        self.queue: deque = deque()
        self.links: set[frozenset] = set()
        self.stored: dict[str, set[int]] = {}
        self.completed: set[str] = set()
        self.dropped: list[tuple[str, str, str]] = []
        self.now = 0.0
        self.ticks = 0
        for k, name in enumerate(seeds + leeches):
            full = name in seeds
            cfg = seed_config if (full and seed_config) else config
            pk = picker() if picker else None
            self.nodes[name] = SwarmEngine(num_pieces, bytes([full]) * num_pieces, config=cfg,
                                           rng=random.Random(k), picker=pk)
            self.stored[name] = set(range(num_pieces)) if full else set()

    def connect(self, a, b):
        self.links.add(frozenset((a, b)))
        ea, eb = self.nodes[a], self.nodes[b]
        fa, fb = ea.hello_flags(), eb.hello_flags()
        self.handle(a, ea.peer_connected(b, fb, self.now))
        self.handle(b, eb.peer_connected(a, fa, self.now))

    def connect_all(self):
        names = list(self.nodes)
        for i, a in enumerate(names):
            for b in names[i + 1 :]:
                self.connect(a, b)

    def handle(self, src, actions):
        eng = self.nodes[src]
        for act in actions:
            if isinstance(act, Send):
                msg = act.message
                if isinstance(msg, Request):
                    assert not eng.have[msg.index], f"{src} requested piece {msg.index} it holds"
                    assert self.nodes[act.peer].have[msg.index], f"{src} asked {act.peer} for a piece it lacks"
                    assert len(eng.peers[act.peer].requested) <= self.config.pipeline_depth
                if isinstance(msg, Have):
                    assert msg.index in self.stored[src], f"{src} announced {msg.index} before storing it"
                self.queue.append((act.peer, src, msg))
            elif isinstance(act, SendPiece):
                assert eng.have[act.index]
                self.on_send_piece(src, act)
                self.queue.append((act.peer, src, ("piece", act.index, src not in self.corrupt)))
                self.queue.append((src, act.peer, ("upload_done", act.index)))
            elif isinstance(act, StorePiece):
                self.stored[src].add(act.index)
            elif isinstance(act, DropPeer):
                self.dropped.append((src, act.peer, act.reason))
                self.links.discard(frozenset((src, act.peer)))
                self.queue.append((act.peer, src, ("gone",)))
            elif isinstance(act, Completed):
                assert len(self.stored[src]) == self.n
                self.completed.add(src)

    def on_send_piece(self, src, act):
        pass

    def deliver(self, dst, src, msg):
        if frozenset((dst, src)) not in self.links and msg != ("gone",):
            return
        eng, t = self.nodes[dst], self.now
        if isinstance(msg, tuple):
            if msg[0] == "piece":
                return self.handle(dst, eng.piece_received(src, msg[1], msg[2], t))
            if msg[0] == "upload_done":
                return self.handle(dst, eng.upload_done(src, msg[1], t))
            return self.handle(dst, eng.peer_gone(src, t))
        if isinstance(msg, Reject):
            return self.handle(dst, eng.peer_reject(src, msg.index, t, busy=msg.reason == BUSY))
        handler = {Request: eng.peer_request, Have: eng.peer_have, Cancel: eng.peer_cancel}
        self.handle(dst, handler[type(msg)](src, msg.index, t))

    def tick(self):
        self.now += self.tick_interval
        self.ticks += 1
        for name in list(self.nodes):
            self.handle(name, self.nodes[name].tick(self.now))

    def run(self, max_steps=200_000, max_ticks=1_000):
        steps, ticks_at_start = 0, self.ticks
        while steps < max_steps and self.ticks - ticks_at_start < max_ticks:
            if not self.queue:
                self.tick()
                if not self.queue:
                    break
                continue
            self.now += 0.001
            self.deliver(*self.queue.popleft())
            steps += 1
        return steps


@pytest.mark.parametrize("picker", [RarestFirstPicker, NaivePicker])
def test_one_seed_many_leeches_all_complete_under_invariants(picker):
    sim = Sim(37, ["seed"], [f"p{i}" for i in range(6)], picker=picker)
    sim.connect_all()
    sim.run()
    assert sim.completed == {f"p{i}" for i in range(6)}
    assert all(sim.stored[n] == set(range(37)) for n in sim.nodes)
    assert not sim.dropped


def test_rarest_first_spreads_first_requests_where_naive_piles_up():
    def first_requests(picker):
        sim = Sim(64, ["seed"], [f"p{i}" for i in range(4)], picker=picker)
        sim.connect_all()
        firsts = set()
        for dst, src, msg in sim.queue:
            if isinstance(msg, Request) and dst == "seed":
                firsts.add(msg.index)
        return firsts

    assert len(first_requests(RarestFirstPicker)) > len(first_requests(NaivePicker))


@pytest.mark.parametrize("held, expected", [
    (4, [9, 6, 11, 8]),  # past random_first: fewest holders first (6 and 9 have one), rank breaks ties
    (2, [11, 10, 9, 8]),  # still in the random phase: rank alone, however rare a piece is
])
def test_the_picker_asks_for_the_rarest_pieces_once_it_holds_its_random_first_ones(held, expected):
    import numpy as np

    from p2p.pieces.engine import PeerState

    engine = SwarmEngine(12, bytes([1] * held + [0] * (12 - held)), rng=random.Random(3))
    engine.availability[:] = [0, 0, 3, 3, 3, 3, 1, 3, 2, 1, 3, 2]
    engine.rank[:] = np.arange(12)[::-1]  # by rank alone the highest indices come first
    peer = PeerState(bits=np.ones(12, dtype=bool), timed_out=np.zeros(12, dtype=bool))
    assert RarestFirstPicker(random_first=4).pick(engine, peer, 4) == expected


def test_corrupt_peer_is_dropped_and_everyone_still_completes():
    sim = Sim(20, ["seed", "bad"], ["p0", "p1", "p2"], corrupt={"bad"})
    sim.connect_all()
    sim.run()
    assert sim.completed == {"p0", "p1", "p2"}
    assert any(peer == "bad" and "corrupt" in reason for _, peer, reason in sim.dropped)


def test_super_seed_sends_no_piece_twice_while_another_was_never_sent():
    cfg = EngineConfig(super_seed=True)
    sim = Sim(48, ["seed"], [f"p{i}" for i in range(8)], seed_config=cfg)
    sends: list[int] = []

    def watch(src, act):
        if src == "seed":
            counts = sim.nodes["seed"].sent_count
            if act.index in sends:
                assert all(counts[i] >= 1 for i in range(48)), "piece sent twice while another was never sent"
            sends.append(act.index)

    sim.on_send_piece = watch
    sim.connect_all()
    assert not any(sim.nodes["seed"].hello_flags())  # a super-seed advertises nothing up front
    sim.run()
    assert sim.completed == {f"p{i}" for i in range(8)}
    assert sorted(set(sends)) == list(range(48))
    assert len(sends) <= 1.2 * 48


def test_endgame_asks_two_holders_and_cancels_the_loser():
    eng = SwarmEngine(1, b"\x00", config=EngineConfig(pipeline_depth=2))
    out = eng.peer_connected("a", b"\x01", 0.0) + eng.peer_connected("b", b"\x01", 0.0)
    assert {(a.peer, a.message) for a in out} == {("a", Request(0)), ("b", Request(0))}
    out = eng.piece_received("b", 0, True, 1.0)
    assert StorePiece(0) in out and Send("a", Cancel(0)) in out and Completed() in out
    assert eng.piece_received("a", 0, True, 1.5) == []  # the late duplicate is harmless, not a protocol error


def test_request_timeout_reissues_elsewhere_and_stall_drops():
    cfg = EngineConfig(pipeline_depth=1, request_timeout=5, stall_timeout=20, endgame=False)
    eng = SwarmEngine(2, b"\x00\x00", config=cfg, rng=random.Random(3))
    first = eng.peer_connected("slow", b"\x01\x01", 0.0)
    slow_piece = first[0].message.index
    eng.peer_connected("fast", b"\x01\x01", 0.0)
    assert eng.tick(4.0) == []
    out = eng.tick(6.0)
    assert Send("slow", Cancel(slow_piece)) in out
    assert Send("fast", Request(slow_piece)) not in out or eng.pending[slow_piece] == {"fast"}
    assert all(not (isinstance(a, Send) and a.peer == "slow" and a.message == Request(slow_piece)) for a in out)
    out = eng.tick(30.0)
    assert any(isinstance(a, DropPeer) and a.peer in ("slow", "fast") for a in out)


def test_unrequested_piece_drops_the_sender():
    eng = SwarmEngine(4, b"\x00" * 4)
    eng.peer_connected("x", b"\x00" * 4, 0.0)
    out = eng.piece_received("x", 2, True, 1.0)
    assert out[0] == DropPeer("x", "sent piece 2 that was not requested") and "x" not in eng.peers


def test_requests_for_missing_pieces_are_rejected_and_count_towards_the_flood_limit():
    eng = SwarmEngine(3, b"\x01\x01\x00", config=EngineConfig(upload_slots=1, max_queued_requests=2))
    eng.peer_connected("x", b"\x00\x00\x00", 0.0)
    assert eng.peer_request("x", 2, 0.0) == [Send("x", Reject(2, "missing"))]
    assert eng.peer_request("x", 0, 0.0) == [SendPiece("x", 0)]  # served at once: it no longer counts
    assert eng.peer_request("x", 2, 0.0) == [Send("x", Reject(2, "missing"))]
    assert eng.peer_request("x", 2, 0.0) == [DropPeer("x", "flooded us with requests")]  # refused ones count
    assert "x" not in eng.peers


def test_duplicate_requests_count_towards_the_flood_limit_before_they_are_folded():
    """Folded before counting, a duplicate never grows the queue, and re-requesting one piece never reaches the
    limit."""
    eng = SwarmEngine(3, b"\x01\x01\x01", config=EngineConfig(upload_slots=1, max_queued_requests=3))
    eng.peer_connected("x", b"\x00\x00\x00", 0.0)
    assert eng.peer_request("x", 0, 0.0) == [SendPiece("x", 0)]  # served at once: no longer open
    assert eng.peer_request("x", 1, 0.0) == []  # queued behind the one slot
    assert eng.peer_request("x", 1, 0.0) == []  # a duplicate: folded, but counted
    assert eng.peer_request("x", 0, 0.0) == []  # the piece on its way: folded, counted
    assert eng.peer_request("x", 1, 0.0) == [DropPeer("x", "flooded us with requests")]
    assert "x" not in eng.peers


def test_asking_again_for_a_piece_received_on_the_link_drops_the_peer():
    eng = SwarmEngine(2, b"\x01\x01")
    eng.peer_connected("leech", b"\x00\x00", 0.0)
    assert eng.peer_request("leech", 0, 0.0) == [SendPiece("leech", 0)]
    eng.upload_done("leech", 0, 0.1)
    out = eng.peer_request("leech", 0, 0.2)
    assert out[0] == DropPeer("leech", "asked again for piece 0, which it already received on this link")
    assert "leech" not in eng.peers


def test_a_cancelled_piece_may_be_asked_again_once_and_a_failed_send_is_not_a_delivery():
    """An honest peer cancels a request that timed out and may ask again while our copy was on its way."""
    eng = SwarmEngine(2, b"\x01\x01")
    eng.peer_connected("p", b"\x00\x00", 0.0)
    assert eng.peer_request("p", 1, 0.0) == [SendPiece("p", 1)]
    eng.upload_done("p", 1, 0.1, delivered=False)  # our copy went bad on disk: it was never sent
    assert eng.peer_request("p", 1, 0.2) == [SendPiece("p", 1)]
    eng.upload_done("p", 1, 0.3)
    assert eng.peer_cancel("p", 1, 0.4) == []  # its cancel crossed our piece
    assert eng.peer_request("p", 1, 0.5) == [SendPiece("p", 1)]  # forgiven once
    eng.upload_done("p", 1, 0.6)
    eng.peer_cancel("p", 1, 0.7)
    assert isinstance(eng.peer_request("p", 1, 0.8)[0], DropPeer)  # not twice


def test_a_peer_takes_a_few_copies_of_the_version_unless_it_serves_pieces_back():
    cfg = EngineConfig(upload_factor=1.0, earn_per_piece=1.0)
    eng = SwarmEngine(2, b"\x01\x01", config=cfg)

    def download_both(peer, now):
        eng.peer_connected(peer, b"\x00\x00", now)
        for index in (0, 1):
            assert eng.peer_request(peer, index, now) == [SendPiece(peer, index)]
            eng.upload_done(peer, index, now)
        eng.peer_gone(peer, now)  # a new link forgets what was sent on the old one, the ledger does not

    download_both("leech", 0.0)
    eng.peer_connected("leech", b"\x00\x00", 1.0)
    out = eng.peer_request("leech", 0, 1.0)
    assert out[0] == DropPeer("leech", "took 2 pieces of a 2-piece version without serving enough back")
    download_both("fair", 2.0)  # the same, but it served us a verified piece: one more is earned
    eng.ledger.note_received("fair")
    eng.peer_connected("fair", b"\x00\x00", 3.0)
    assert eng.peer_request("fair", 0, 3.0) == [SendPiece("fair", 0)]


def test_endgame_re_requests_across_different_links_drop_nobody():
    """Endgame asks two holders for one piece and re-asks after timeouts: each holder sees one request per
    piece on its link, so the earned-upload rules never drop an honest peer."""
    cfg = EngineConfig(endgame_copies=3, request_timeout=0.01, pipeline_depth=2)
    sim = Sim(9, ["s0", "s1", "s2"], ["p0", "p1"], config=cfg)
    sim.connect_all()
    sim.run()
    assert sim.completed == {"p0", "p1"}
    assert not sim.dropped


def test_late_peer_completes_from_reseeders_after_the_seed_leaves():
    sim = Sim(30, ["seed"], ["p0", "p1", "p2"])
    sim.connect_all()
    sim.run()
    sim.links = {link for link in sim.links if "seed" not in link}
    for p in ("p0", "p1", "p2"):
        sim.handle(p, sim.nodes[p].peer_gone("seed", sim.now))
    late = SwarmEngine(30, bytes(30), rng=random.Random(9))
    sim.nodes["late"], sim.stored["late"] = late, set()
    for p in ("p0", "p1", "p2"):
        sim.connect("late", p)
    sim.run()
    assert "late" in sim.completed


def test_a_peer_idle_for_long_is_not_dropped_when_it_finally_has_something():
    eng = SwarmEngine(2, b"\x00\x00", config=EngineConfig(stall_timeout=20))
    eng.peer_connected("x", b"\x00\x00", 0.0)
    assert eng.peer_have("x", 1, 500.0) == [Send("x", Request(1))]
    assert not any(isinstance(a, DropPeer) for a in eng.tick(501.0))
    assert DropPeer("x", "sent nothing for too long while owing pieces", hostile=False) in eng.tick(521.0)


def test_engines_without_an_explicit_rng_do_not_all_rank_pieces_alike():
    # identical ranks made every peer of a flash crowd ask the seed for the same pieces (measured: 7.8x the file)
    a, b = SwarmEngine(64, bytes(64)), SwarmEngine(64, bytes(64))
    assert list(a.rank) != list(b.rank)


def test_a_timed_out_piece_is_asked_again_of_its_only_holder():
    """A super-seed is the only holder of what it reveals: never re-asking it after one slow answer stalls forever."""
    cfg = EngineConfig(pipeline_depth=1, request_timeout=5, endgame=False)
    eng = SwarmEngine(1, b"\x00", config=cfg)
    assert eng.peer_connected("seed", b"\x01", 0.0) == [Send("seed", Request(0))]
    out = eng.tick(6.0)
    assert out[0] == Send("seed", Cancel(0)) and Send("seed", Request(0)) in out


def test_super_seed_withdraws_a_cancelled_promise_so_the_first_round_goes_on():
    cfg = EngineConfig(super_seed=True, super_seed_reveal=1)
    seed = SwarmEngine(3, b"\x01\x01\x01", config=cfg, rng=random.Random(0))
    (first,) = seed.peer_connected("a", b"\x00\x00\x00", 0.0)
    assert seed.peer_request("a", first.message.index, 0.5) == [SendPiece("a", first.message.index)]
    (second,) = seed.upload_done("a", first.message.index, 0.6)  # a asked before: this promise holds its piece
    promised = second.message.index
    (other,) = {0, 1, 2} - {first.message.index, promised}
    assert seed.peer_connected("b", b"\x00\x00\x00", 0.0) == [Send("b", Have(other))]
    assert seed.peer_request("b", other, 1.0) == [SendPiece("b", other)]
    assert seed.upload_done("b", other, 2.0) == []  # the only never-sent piece is promised to a
    assert seed.peer_cancel("a", promised, 3.0) == [Send("b", Have(promised))]


def test_super_seed_promises_to_peers_that_never_ask_hold_no_piece_back():
    """Links that take a place and never ask were each promised pieces; holding those back left the peers that
    asked with nothing until the silent links were released."""
    cfg = EngineConfig(super_seed=True, super_seed_reveal=2)
    seed = SwarmEngine(4, b"\x01" * 4, config=cfg, rng=random.Random(0))
    for squatter in ("s1", "s2"):
        assert len(seed.peer_connected(squatter, bytes(4), 0.0)) == 2  # every piece promised, none ever asked
    grace = cfg.reveal_grace
    assert seed.peer_connected("early", bytes(4), grace / 2) == []  # within the grace: they may still ask
    assert seed.reveal_lapsed(grace * 0.9) == []
    assert len(seed.reveal_lapsed(grace)) == 2  # lapsed: the early peer hears of two pieces
    revealed = seed.peer_connected("honest", bytes(4), grace)
    assert len(revealed) == 2
    index = revealed[0].message.index
    assert seed.peer_request("honest", index, grace + 0.1) == [SendPiece("honest", index)]


def test_super_seed_serves_every_copy_when_peers_cannot_share():
    """Single-origin: peers linked only to the super-seed must still complete (it once stopped after one copy,
    re-revealing pieces the peers already held, which they never asked for again)."""
    sim = Sim(40, ["seed"], [f"p{i}" for i in range(4)], seed_config=EngineConfig(super_seed=True))
    for i in range(4):
        sim.connect("seed", f"p{i}")
    sim.run()
    assert sim.completed == {f"p{i}" for i in range(4)}
    assert sim.nodes["seed"].sent_count.sum() == 4 * 40  # one copy per peer, none wasted


def test_a_piece_whose_requests_timed_out_at_every_holder_is_asked_again():
    """Each holder of a piece whose request timed out was avoided while another holder existed, so when the
    requests to both holders had timed out (a loaded machine) the piece was never asked for again: a peer of a
    two-peer broadcast sat at 8 of 9 pieces for minutes."""
    cfg = EngineConfig(request_timeout=5.0, stall_timeout=1000.0, endgame=False)
    eng = SwarmEngine(2, b"\x01\x00", config=cfg, rng=random.Random(0))
    first = eng.peer_connected("a", b"\x01\x01", 0.0)
    second = eng.peer_connected("b", b"\x01\x01", 0.0)
    asked = [a.peer for a in first + second if isinstance(a, Send) and isinstance(a.message, Request)]
    assert asked == ["a"]  # one request for the one missing piece
    later = eng.tick(6.0)  # a's request timed out: b, which has not timed out on it, is asked
    assert [a.peer for a in later if isinstance(a, Send) and isinstance(a.message, Request)] == ["b"]
    again = eng.tick(12.0)  # b's timed out too: someone must be asked again, or the piece never comes
    assert [a.message for a in again if isinstance(a, Send) and isinstance(a.message, Request)] == [Request(1)]


def test_a_piece_stored_while_hellos_crossed_is_announced_to_the_new_peer():
    """Our hello to `late` left before piece 1 was stored; `_accept` announced it only to peers connected then, so
    `late` hears of it when it connects, or it would never ask us for it."""
    eng = SwarmEngine(3, b"\x01\x00\x00", rng=random.Random(1))
    told = eng.hello_flags()
    asked = eng.peer_connected("seed", b"\x01\x01\x01", 0.0)
    index = next(a.message.index for a in asked if isinstance(a, Send) and isinstance(a.message, Request))
    eng.piece_received("seed", index, True, 1.0)
    out = eng.peer_connected("late", b"\x00\x00\x00", 2.0, told)
    assert Send("late", Have(index)) in out and Send("late", Have(0)) not in out  # piece 0 was in the hello
    without_told = eng.peer_connected("other", b"\x00" * 3, 3.0)  # no hello to compare with: nothing extra
    assert not any(isinstance(a, Send) and isinstance(a.message, Have) for a in without_told)
