"""Opportunistic grafting and mesh-quality replacement run every OPPORTUNISTIC_GRAFT_TICKS heartbeats
(p2p.gossip.pubsub.LeanGossipSub), as gossipsub v1.1 schedules them, not at every heartbeat; IHAVE gossip goes out
every GOSSIP_EVERY_TICKS heartbeats and still advertises every message; the scorer's decay step runs only when it
decays something."""

from __future__ import annotations

from types import SimpleNamespace

from libp2p.peer.id import ID
from libp2p.pubsub.gossipsub import PROTOCOL_ID_V12, GossipSub
from libp2p.pubsub.mcache import default_msg_id_fn
from libp2p.pubsub.pb import rpc_pb2
from libp2p.pubsub.score import ScoreParams, TopicScoreParams

from p2p.gossip.pubsub import GOSSIP_EVERY_TICKS, OPPORTUNISTIC_GRAFT_TICKS, LeanGossipSub, decays_anything
from p2p.gossip.service import GossipConfig, gossip_router


async def test_grafting_and_mesh_replacement_run_once_every_graft_ticks_heartbeats(monkeypatch):
    calls: list[tuple[str, int]] = []

    async def quality(self, topic):
        calls.append(("quality", self.heartbeats))

    monkeypatch.setattr(GossipSub, "mesh_heartbeat", lambda self: ({}, {}))
    monkeypatch.setattr(GossipSub, "_perform_opportunistic_grafting",
                        lambda self, topic, grafts: calls.append(("graft", self.heartbeats)) or 1)
    monkeypatch.setattr(GossipSub, "_maintain_mesh_quality", quality)
    router = LeanGossipSub(protocols=[PROTOCOL_ID_V12], degree=6, degree_low=4, degree_high=12)
    grafted = []
    for _ in range(2 * OPPORTUNISTIC_GRAFT_TICKS):
        router.mesh_heartbeat()  # py-libp2p's heartbeat: the mesh, with grafting inside it, then mesh quality
        grafted.append(router._perform_opportunistic_grafting("topic", {}))
        await router._maintain_mesh_quality("topic")
    ticks = [OPPORTUNISTIC_GRAFT_TICKS, 2 * OPPORTUNISTIC_GRAFT_TICKS]
    assert calls == [(kind, tick) for tick in ticks for kind in ("graft", "quality")]
    assert sum(grafted) == 2  # the rounds in between graft nobody


def _router_with_topic_peers(peers: list) -> LeanGossipSub:
    """The node's real router (p2p.gossip.service.gossip_router) with a pubsub stand-in that knows `peers` on one topic,
    none of them in our mesh: every one is a candidate for IHAVE gossip."""
    router = gossip_router(GossipConfig())
    router.pubsub = SimpleNamespace(peer_topics={"t": set(peers)})
    router.mesh = {"t": set()}
    router.peer_protocol = {peer: PROTOCOL_ID_V12 for peer in peers}
    return router


def _message(seq: int) -> rpc_pb2.Message:
    return rpc_pb2.Message(from_id=b"origin", seqno=seq.to_bytes(8, "big"), data=b"x", topicIDs=["t"])


def test_ihave_goes_out_every_gossip_ticks_heartbeats_and_advertises_every_message_once():
    peers = [ID(bytes([i]) * 8) for i in range(20)]
    router = _router_with_topic_peers(peers)
    advertised: list[bytes] = []
    rounds = []
    for tick in range(1, 4 * GOSSIP_EVERY_TICKS + 1):
        router.mcache.put(_message(tick))  # one message arrives in every heartbeat interval
        router.heartbeats = tick  # what mesh_heartbeat counts at the start of py-libp2p's heartbeat
        gossip = router.gossip_heartbeat()
        if gossip:
            rounds.append(tick)
            ids = {tuple(topics["t"]) for topics in gossip.values()}
            assert len(ids) == 1  # every chosen peer hears the same window
            advertised += list(next(iter(ids)))
            assert 6 <= len(gossip) < len(peers)  # D_lazy of the peers outside the mesh
        router.mcache.shift()  # end of py-libp2p's heartbeat
    assert rounds == [GOSSIP_EVERY_TICKS * k for k in range(1, 5)]
    wanted = [default_msg_id_fn(_message(tick)) for tick in range(1, 4 * GOSSIP_EVERY_TICKS + 1)]
    assert sorted(advertised) == sorted(wanted)  # each message in exactly one round, none lost between rounds


def test_a_message_advertised_late_in_its_window_is_still_served_to_an_iwant():
    router = _router_with_topic_peers([ID(b"p" * 8)])
    router.mcache.put(_message(1))
    for _ in range(GOSSIP_EVERY_TICKS - 1):
        router.mcache.shift()
    assert default_msg_id_fn(_message(1)) in router.mcache.window("t")  # the round's window still holds it
    router.mcache.shift()  # the round was sent; its IWANTs come back during the next heartbeat interval
    assert router.mcache.get(default_msg_id_fn(_message(1))) is not None


def test_parameters_that_decay_still_decay_and_the_default_ones_leave_counters_as_they_are():
    peer = ID(b"\x00\x24" + bytes(36))
    idle = gossip_router(GossipConfig())  # the node's router: py-libp2p's default score parameters
    idle.scorer.first_message_deliveries[peer]["topic"] = 8.0
    idle.scorer.on_heartbeat()
    assert not decays_anything(idle.scorer.params)
    assert idle.scorer.first_message_deliveries[peer]["topic"] == 8.0

    params = ScoreParams(p2_first_message_deliveries=TopicScoreParams(weight=1.0, cap=10.0, decay=0.5))
    decaying = LeanGossipSub(protocols=[PROTOCOL_ID_V12], degree=6, degree_low=4, degree_high=8, score_params=params)
    decaying.scorer.first_message_deliveries[peer]["topic"] = 8.0
    decaying.scorer.on_heartbeat()
    assert decays_anything(params) and decaying.scorer.first_message_deliveries[peer]["topic"] == 4.0


def test_the_default_decay_step_runs_no_loop(monkeypatch):
    router = gossip_router(GossipConfig())
    looked_at = []
    monkeypatch.setattr(router.scorer, "time_in_mesh", _Watched(looked_at))
    router.scorer.on_heartbeat()
    assert looked_at == []  # py-libp2p's step would list every peer of time_in_mesh, to multiply by 1


class _Watched(dict):
    def __init__(self, seen: list) -> None:
        super().__init__()
        self.seen = seen

    def keys(self):
        self.seen.append("keys")
        return super().keys()
