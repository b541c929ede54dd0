"""`swarm bench sybil`'s gossip attacks: a heartbeat flood and rollout bombs, each from N fresh identities.

Each identity connects to the target, waits until the target has it in its mesh for the attacked topic, and then
publishes as fast as its `rate` allows, its own validator removed so nothing of its own stops it, until the target
hangs up on it (a ban) or its `per_identity_s` runs out; `parallel` identities attack at once, the next one starting
as one ends. A rollout bomb is a well-formed, correctly signed rollout message whose one batch item is about 66 KiB of
zlib that declares and inflates to 64 MiB of zeros (swarm.messages.rollout_codec's compressed inline form).
"""

from __future__ import annotations

import argparse
import functools
import time
import zlib
from collections.abc import Callable

import trio

from p2p.gossip.envelope import seal
from p2p.gossip.service import GossipConfig, open_gossip, topic_for
from p2p.host.p2p_host import open_host
from p2p.identity import Identity
from swarm.bench.gossip_flood import heartbeat_envelope
from swarm.bench.sybil_measure import (
    Meter,
    Target,
    Witness,
    attacker_config,
    counter,
    in_lanes,
    sample_until_cancelled,
    scrape,
    scrape_until_cancelled,
)

BOMB_INFLATED = 64 * 2**20
MESH_WAIT_S = 10.0
SETTLE_S = 3.0
"""Seconds the witness has to join the target's mesh before the baseline is taken."""
MIN_WINDOW_S = 10.0
"""The shortest window the target is measured over, from the attack's start. Why fixed rather than the crowd's own
duration: the crowd ends as soon as the target has refused or banned every identity, so a target that refuses
faster would be measured over a shorter window (the same work, a larger share), and work the crowd leaves behind
(hang-ups, pubsub's cleanup, refused handshakes still in flight) would fall outside it. A short crowd is thus
measured as a burst within a fixed window; a crowd that lasts longer is measured over all of it."""
AFTERMATH_S = 2.0
"""Seconds the window goes on after a crowd that outlasts MIN_WINDOW_S, for the work it leaves behind."""
FLOODER = GossipConfig(router_rate_limit=5000.0, publish_rate=4000.0)
"""The attackers' own pacing, lifted far above what any receiver admits."""


@functools.cache
def bomb_body() -> dict:
    """A rollout body of one compressed inline item: 64 MiB of zeros as about 66 KiB of zlib."""
    return {"batch": [{"z": zlib.compress(bytes(BOMB_INFLATED), 9), "n": BOMB_INFLATED}]}


def bomb_envelope(run: str, identity: Identity, ts: float, seq: int) -> bytes:
    return seal("rollout", run, bomb_body(), identity, ts, seq)


Envelope = Callable[[str, Identity, float, int], bytes]


async def _one_identity(identity: Identity, target_addr: str, run: str, kind: str, envelope: Envelope, rate: float,
                        until: float, record: dict) -> None:
    """Connect, wait for the target's mesh, publish `envelope`s at `rate` until hung up on or `until` (trio time)."""
    target_id = target_addr.rsplit("/p2p/", 1)[1]
    async with open_host(attacker_config(identity)) as host, \
            open_gossip(host, run, kinds=(kind,), config=FLOODER) as gossip:
        await host.connect(target_addr)
        with trio.move_on_after(MESH_WAIT_S):
            await gossip.wait_for_mesh(target_id, kind)
        topic = topic_for(run, kind)
        gossip.pubsub.remove_topic_validator(topic)
        seq = int(time.time() * 1e6)
        while trio.current_time() < until and target_id in {str(p) for p in host.libp2p.get_connected_peers()}:
            seq += 1
            await gossip.pubsub.publish(topic, envelope(run, identity, time.time(), seq))
            record["sent"] += 1
            await trio.sleep(1 / rate)
        record["hung_up"] += target_id not in {str(p) for p in host.libp2p.get_connected_peers()}


async def attack_with(identities: list[Identity], target_addr: str, run: str, kind: str, envelope: Envelope,
                      rate: float, per_identity_s: float, parallel: int, deadline: float) -> dict:
    """Every identity in turn, `parallel` at a time, each for at most `per_identity_s`; all end by `deadline`, and
    an identity whose turn comes after it never starts."""
    record = {"identities_used": 0, "sent": 0, "hung_up": 0}

    async def turn(identity: Identity) -> bool:
        if trio.current_time() >= deadline:
            return False
        record["identities_used"] += 1
        await _one_identity(identity, target_addr, run, kind, envelope, rate,
                            min(deadline, trio.current_time() + per_identity_s), record)
        return True

    turns: list = []
    with trio.move_on_at(deadline + MESH_WAIT_S):
        await in_lanes(identities, parallel, turn, turns)
    return {**record, "failed": turns.count(None)}  # the target refused the identity's dial or stream


async def measure_gossip_attack(target: Target, run: str, identities: list[Identity], kind: str,
                                envelope: Envelope, args: argparse.Namespace) -> dict:
    """The attack against `target` with a witness beside it: the target's CPU and memory over the attack, its bans
    and refusals (its counters' growth), and the attackers' messages the witness received through it."""
    witness = Witness(attackers={i.peer_id for i in identities})
    meter = Meter(target.pid)
    before, after = scrape(target.metrics_port), {}
    async with trio.open_nursery() as nursery:
        await nursery.start(witness.run, run, target.addr, ("heartbeat", "rollout"))
        await trio.sleep(SETTLE_S)
        meter.start()
        nursery.start_soon(sample_until_cancelled, meter)
        nursery.start_soon(scrape_until_cancelled, target.metrics_port, after)
        started = trio.current_time()
        attack = await attack_with(identities, target.addr, run, kind, envelope, args.rate, args.per_identity_s,
                                   args.parallel, started + args.seconds)
        await trio.sleep_until(max(started + min(MIN_WINDOW_S, args.seconds), trio.current_time() + AFTERMATH_S))
        meter.stop()
        nursery.cancel_scope.cancel()
    after.update(scrape(target.metrics_port))  # the final counters, if the target still answers
    return {**meter.result(), **attack, "forwarded": witness.forwarded,
            "bans": counter(after, "rlswarm_gossip_bans") - counter(before, "rlswarm_gossip_bans"),
            "refused": counter(after, "rlswarm_gossip_refused") - counter(before, "rlswarm_gossip_refused"),
            "inbound_refused": counter(after, "rlswarm_inbound_refused") - counter(before, "rlswarm_inbound_refused"),
            "peer_died": meter.died or not target.alive()}


async def gossip_flood(target: Target, run: str, identities: list[Identity], args: argparse.Namespace) -> dict:
    """Each identity floods well-formed heartbeats until it is banned, then the next one comes."""
    return await measure_gossip_attack(target, run, identities, "heartbeat", heartbeat_envelope, args)


async def rollout_bombs(target: Target, run: str, identities: list[Identity], args: argparse.Namespace) -> dict:
    """Each identity sends rollout bombs (64 MiB declared, about 66 KiB sent) until it is banned."""
    bomb_body()  # compressed once, before the clock starts
    return await measure_gossip_attack(target, run, identities, "rollout", bomb_envelope, args)
