"""The parts of a gossip session on their own (p2p.gossip.penalties, p2p.gossip.validator): who answers for a
refused message, that a ban reads the session's nursery when it happens (not when the parts were built), that an
ended ban leaves the blacklist, and that the validator hands every refusal over, empties it and never raises."""

from __future__ import annotations

from types import SimpleNamespace

import trio
from libp2p.peer.id import ID
from libp2p.pubsub.pb import rpc_pb2

from p2p.errors import EnvelopeError
from p2p.gossip.admission import AdmissionConfig
from p2p.gossip.envelope import DEFAULT_POLICY, seal
from p2p.gossip.parts import GossipStats
from p2p.gossip.penalties import TIMING_REASONS, GossipPenalties
from p2p.gossip.validator import GossipValidator
from p2p.identity import Identity
from p2p.scores import ScoreConfig

ME, ORIGIN, RELAY, OTHER = (Identity(bytes([n]) * 32) for n in (31, 32, 33, 34))
RUN = "run-parts"


def _penalties(session: SimpleNamespace, blacklisted: set[ID]) -> GossipPenalties:
    return GossipPenalties(SimpleNamespace(peer_id=ME.peer_id), ScoreConfig(), GossipStats(), 8,
                           blacklist=blacklisted.add, unblacklist=blacklisted.discard,
                           session_nursery=lambda: None if session.closing else session.nursery)


def _id(identity: Identity) -> ID:
    return ID.from_base58(identity.peer_id)


async def test_a_refusal_costs_the_origin_and_the_relay_for_content_and_never_a_relay_for_timing(autojump_clock):
    penalties = _penalties(SimpleNamespace(nursery=None, closing=False), set())
    msg = rpc_pb2.Message(from_id=_id(ORIGIN).to_bytes())
    now = trio.current_time()
    penalties.reject_message(_id(RELAY), msg, "bad_signature")  # content, relayed: both pay
    assert penalties.scores.score(ORIGIN.peer_id, now) < 0 and penalties.scores.score(RELAY.peer_id, now) < 0
    before = {p.peer_id: penalties.scores.score(p.peer_id, now) for p in (ORIGIN, RELAY)}
    for reason in TIMING_REASONS:  # timing, relayed: nobody pays
        penalties.reject_message(_id(RELAY), msg, reason)
    assert {p.peer_id: penalties.scores.score(p.peer_id, now) for p in (ORIGIN, RELAY)} == before
    penalties.reject_message(_id(ORIGIN), msg, "replayed")  # timing, handed over by the origin: it pays
    assert penalties.scores.score(ORIGIN.peer_id, now) < before[ORIGIN.peer_id]
    penalties.reject_message(_id(RELAY), msg, "node_busy")  # a shared budget: counted, costs nobody
    assert penalties.scores.score(RELAY.peer_id, now) == before[RELAY.peer_id]
    assert penalties.stats.rejected == {"bad_signature": 1, **dict.fromkeys(TIMING_REASONS, 1), "replayed": 2,
                                        "node_busy": 1}
    penalties.penalize(ME.peer_id, "malformed")  # never ourselves
    assert penalties.scores.score(ME.peer_id, now) == 0


async def test_a_ban_hangs_up_in_the_nursery_the_session_has_when_it_happens_and_not_while_it_closes(autojump_clock):
    started: list[ID] = []
    session, blacklisted = SimpleNamespace(nursery=None, closing=False), set()
    penalties = _penalties(session, blacklisted)
    session.nursery = SimpleNamespace(start_soon=lambda fn, peer_id: started.append(peer_id))  # set after building
    for _ in range(3):
        penalties.penalize(ORIGIN.peer_id, "bad_signature")
    assert started == [_id(ORIGIN)] and blacklisted == {_id(ORIGIN)} and penalties.stats.bans == 1
    session.closing = True
    for _ in range(3):
        penalties.penalize(RELAY.peer_id, "bad_signature")
    assert started == [_id(ORIGIN)] and blacklisted == {_id(ORIGIN), _id(RELAY)} and penalties.stats.bans == 2
    assert penalties.banned_peers() == [ORIGIN.peer_id, RELAY.peer_id]
    assert [penalties.rejections.receive_nowait().banned for _ in range(6)] == [False, False, True] * 2


async def test_an_ended_ban_takes_the_peer_off_the_blacklist(autojump_clock):
    blacklisted: set[ID] = set()
    penalties = _penalties(SimpleNamespace(nursery=None, closing=False), blacklisted)
    for _ in range(3):
        penalties.penalize(ORIGIN.peer_id, "bad_signature")
    penalties.lift_ended_bans(trio.current_time())
    assert blacklisted == {_id(ORIGIN)}
    await trio.sleep(ScoreConfig().ban_s)
    penalties.lift_ended_bans(trio.current_time())
    assert blacklisted == set() and penalties.banned_peers() == []


def _validator(refused: list[tuple[ID, str]], decoders=None) -> GossipValidator:
    return GossipValidator(RUN, lambda: 1_000_000.0, DEFAULT_POLICY, AdmissionConfig(), 100, 4, decoders,
                           me=lambda: _id(ME), refuse=lambda peer, msg, reason: refused.append((peer, reason)))


def _message(identity: Identity, seq: int) -> rpc_pb2.Message:
    data = seal("heartbeat", RUN, {"roles": ["seed"]}, identity, 1_000_000.0, seq)
    return rpc_pb2.Message(from_id=_id(identity).to_bytes(), seqno=seq.to_bytes(8, "big"), data=data)


async def test_the_validator_keeps_what_it_verified_and_hands_over_every_refusal_emptied_without_raising():
    refused: list[tuple[ID, str]] = []

    def decode(env):
        if env.seq == 2:
            raise EnvelopeError("bad_body", "refused by its decoder")
        if env.seq == 3:
            raise RuntimeError("a decoder nobody foresaw failing")
        return "typed"

    checks = _validator(refused, {"heartbeat": decode})
    validate = checks.for_kind("heartbeat")
    good, own = _message(ORIGIN, 1), _message(ME, 1)
    assert validate(_id(RELAY), good) and validate(_id(ME), own) and refused == []
    assert checks.take_verified(own) is None  # our own publish: never checked, never delivered
    assert checks.take_verified(good).message == "typed" and checks.take_verified(good) is None
    assert validate(_id(RELAY), _message(ORIGIN, 1)) is False  # a replay of `good`
    for origin, seq in ((RELAY, 2), (OTHER, 3)):  # one origin's heartbeats may come two at a time
        msg = _message(origin, seq)
        assert validate(_id(RELAY), msg) is False and msg.data == b""
    assert refused == [(_id(RELAY), "replayed"), (_id(RELAY), "bad_body"), (_id(RELAY), "bad_body")]
