"""Opportunistic grafting and mesh-quality replacement run every OPPORTUNISTIC_GRAFT_TICKS heartbeats
(p2p.libp2p_pubsub.LeanGossipSub), as gossipsub v1.1 schedules them, not at every heartbeat."""

from __future__ import annotations

from libp2p.pubsub.gossipsub import PROTOCOL_ID_V12, GossipSub

from p2p.libp2p_pubsub import OPPORTUNISTIC_GRAFT_TICKS, LeanGossipSub


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
