"""Receiving rollout messages under load: a slow announcer holds up only its own groups, floods beyond the
pending bound are dropped, and a handler's exception costs only its message. Every wait is bounded; no sleeps."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest
import trio


@dataclass(frozen=True)
class Envelope:
    sender_peer_id: str
    body: Any


async def _receive_all(monkeypatch, envelopes: list[Envelope], flow, stall: dict[str, float]):
    """receive_groups over `envelopes` with receive_envelope replaced by one that takes stall[sender] seconds;
    returns (delivered (time, body), the most envelopes of one sender in progress at once)."""
    import swarm.messages.rollout_transport as transport

    running: dict[str, int] = {}
    most = {}

    async def fake_receive_envelope(node, env, refused, limits, fetch, wanted):
        running[env.sender_peer_id] = running.get(env.sender_peer_id, 0) + 1
        most[env.sender_peer_id] = max(most.get(env.sender_peer_id, 0), running[env.sender_peer_id])
        await trio.sleep(stall.get(env.sender_peer_id, 0.0))
        running[env.sender_peer_id] -= 1
        return [] if env.body is None else [env.body]

    monkeypatch.setattr(transport, "receive_envelope", fake_receive_envelope)
    send, receive = trio.open_memory_channel(len(envelopes))
    for env in envelopes:
        send.send_nowait(env)
    send.close()
    delivered = []
    await transport.receive_groups(None, receive, lambda group: delivered.append((trio.current_time(), group)),
                                   flow=flow)
    return delivered, most


async def test_a_slow_announcer_holds_up_only_its_own_groups(monkeypatch, autojump_clock):
    from swarm.messages.rollout_transport import ReceiveFlow

    slow = [Envelope("slow", f"slow-{i}") for i in range(5)]
    envelopes = slow + [Envelope("fast", "fast-0"), Envelope("fast", None), Envelope("other", "other-0")]
    start = trio.current_time()
    delivered, most = await _receive_all(monkeypatch, envelopes, ReceiveFlow(concurrent=4, per_sender=2),
                                         stall={"slow": 9.0})
    at = {body: t - start for t, body in delivered}
    assert at["fast-0"] < 1.0 and at["other-0"] < 1.0  # not behind the slow announcer's five fetches
    assert sorted(b for b in at if b.startswith("slow")) == [f"slow-{i}" for i in range(5)]  # all delivered...
    assert max(at.values()) == pytest.approx(27.0)  # ...two at a time: 9 s, 9 s, 9 s
    assert most["slow"] == 2 and len(delivered) == 7  # the refused one (None) is not delivered


async def test_a_flood_beyond_the_pending_bound_is_dropped(monkeypatch, autojump_clock):
    from swarm.messages.rollout_transport import ReceiveFlow

    flood = [Envelope(f"peer-{i}", f"group-{i}") for i in range(10)]
    delivered, _ = await _receive_all(monkeypatch, flood, ReceiveFlow(concurrent=2, per_sender=1, pending=3),
                                      stall={f"peer-{i}": 5.0 for i in range(10)})
    assert sorted(body for _, body in delivered) == ["group-0", "group-1", "group-2"]


def test_receive_flow_bounds_are_checked():
    from swarm.messages.rollout_transport import ReceiveFlow

    with pytest.raises(ValueError):
        ReceiveFlow(concurrent=2, per_sender=3)


async def test_an_exception_in_a_rollout_handler_drops_that_message_and_the_role_receives_on(
        monkeypatch, autojump_clock):
    """Fault injection at the rollout boundary: a RuntimeError raised while one envelope is received or its group
    delivered drops that envelope and scores its sender; receive_groups (and the role running it) goes on."""
    from types import SimpleNamespace

    import swarm.messages.rollout_transport as transport

    scored = []
    monkeypatch.setattr(transport, "_score_down", lambda node, peer, reason: scored.append((peer, reason)))
    envelopes = [Envelope("mallory", "boom-in-receive"), Envelope("mallory", "boom-in-deliver"),
                 Envelope("honest", "group-0")]

    async def receive_envelope(node, env, refused, limits, fetch, wanted):
        if env.body == "boom-in-receive":
            raise RuntimeError("injected fault while receiving")
        return [env.body]

    def deliver(group):
        if group == "boom-in-deliver":
            raise RuntimeError("injected fault while delivering")
        delivered.append(group)

    monkeypatch.setattr(transport, "receive_envelope", receive_envelope)
    send, receive = trio.open_memory_channel(len(envelopes))
    for env in envelopes:
        send.send_nowait(env)
    send.close()
    delivered: list = []
    await transport.receive_groups(SimpleNamespace(), receive, deliver)
    assert delivered == ["group-0"] and scored == [("mallory", "handler_error")] * 2
