"""A hostile peer against real py-libp2p hosts on loopback: inflating envelopes and a heartbeat flood.

Line topology mallory - target - witness: whatever the target forwards, the witness receives. The target runs the
run's typed decoders (swarm.messages.gossip_bodies) as a node does. Counts only; the CPU and memory figures come from
`swarm bench gossip-flood` (a benchmark, not a timed test)."""

from __future__ import annotations

from contextlib import AsyncExitStack

import pytest
import trio

from p2p.gossip.service import Gossip, open_gossip, topic_for
from p2p.host.p2p_host import HostConfig, open_host
from p2p.identity import Identity
from swarm.bench.gossip_flood import heartbeat_envelope, inflating_envelope
from swarm.messages.gossip_bodies import DECODERS

RUN = "run-flood"
LIMIT = 40


async def _line(stack: AsyncExitStack) -> list[Gossip]:
    out = []
    for i in range(3):
        host = await stack.enter_async_context(open_host(HostConfig(identity=Identity(bytes([40 + i]) * 32))))
        out.append(await stack.enter_async_context(
            open_gossip(host, RUN, kinds=tuple(DECODERS), decoders=DECODERS)))
    for left, right in zip(out, out[1:]):
        await left.host.connect(right.host.multiaddrs[0])
    for kind in ("heartbeat", "rollout"):
        for left, right in zip(out, out[1:]):
            await left.wait_for_mesh(right.host.peer_id, kind)
            await right.wait_for_mesh(left.host.peer_id, kind)
    return out


def _raw_publisher(gossip: Gossip, kind: str):
    """Mallory drops her own validator: she sends whatever bytes she likes."""
    topic = topic_for(RUN, kind)
    gossip.pubsub.remove_topic_validator(topic)
    return lambda data: gossip.pubsub.publish(topic, data)


@pytest.mark.parametrize("first", ["inflating", "heartbeats"])
async def test_a_hostile_peer_is_refused_unforwarded_banned_and_hung_up_on(first):
    with trio.fail_after(LIMIT):
        async with AsyncExitStack() as stack:
            mallory, target, witness = await _line(stack)
            heard = {kind: witness.subscribe(kind) for kind in ("heartbeat", "rollout")}
            delivered = target.subscribe("heartbeat")
            send = {kind: _raw_publisher(mallory, kind) for kind in ("heartbeat", "rollout")}
            now, seq = mallory.clock(), 1_000

            async def inflate(count: int) -> None:
                nonlocal seq
                for _ in range(count):
                    seq += 1
                    await send["rollout"](inflating_envelope(RUN, mallory.identity, now, seq))

            async def flood(count: int) -> None:
                nonlocal seq
                for _ in range(count):
                    seq += 1
                    await send["heartbeat"](heartbeat_envelope(RUN, mallory.identity, now, seq))

            for attack in ([inflate, flood] if first == "inflating" else [flood, inflate]):
                await attack(200 if attack is flood else 8)
            mallory_id = mallory.host.peer_id
            while mallory_id not in target.banned_peers():
                await trio.sleep(0.05)
            while mallory_id in {str(p) for p in target.host.libp2p.get_connected_peers()}:
                await trio.sleep(0.05)  # banned peers are hung up on
            honest = target.subscribe("heartbeat")
            await witness.publish("heartbeat", {"roles": ["seed"]})  # the line still works for honest peers
            while (await honest.receive()).sender_peer_id != witness.host.peer_id:
                pass
            forwarded = _drain(heard["rollout"]) + [e for e in _drain(heard["heartbeat"])
                                                    if e.sender_peer_id == mallory_id]
            from_mallory = [e for e in _drain(delivered) if e.sender_peer_id == mallory_id]
    rejected = target.stats.rejected
    burst = target.config.admission.rates["heartbeat"].burst
    # No inflating envelope is ever forwarded. The first heartbeats are well-formed and within a new peer's
    # allowance; the flood behind them is not. (Validation runs concurrently across topics, so a heartbeat sent
    # after the inflating envelopes may be judged before the ban they earn: the bound is the burst either way.)
    assert all(e.kind == "heartbeat" for e in forwarded) and len(forwarded) <= burst
    assert len(from_mallory) <= burst
    assert rejected["oversized"] >= 1 or first == "heartbeats"  # an inflating envelope stops at its budget
    assert rejected["rate_limited"] >= 1 or first == "inflating"
    assert target.stats.bans == 1 and witness.stats.bans == 0
    assert sum(witness.stats.rejected.values()) == 0  # the witness never saw any of the attack


def _drain(channel) -> list:
    out = []
    while True:
        try:
            out.append(channel.receive_nowait())
        except trio.WouldBlock:
            return out
