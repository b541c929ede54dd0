"""Heartbeats of N peers in virtual time: the message counts a large run implies, from the real heartbeat loop.

Each simulated peer is a real swarm.node.state.Node running the real `send_heartbeats` (so its period stretches
as the node's own peer table grows, swarm.node.heartbeat_budget.heartbeat_stretch) and keeping its tables with the real
`heard_from` and `forget_silent`; only gossip is replaced by a flood that hands every heartbeat to every other
peer at once (what GossipSub delivers, less its duplicates, which swarm.bench.scale measures on real hosts).
Under the autojump clock a run of thousands of virtual seconds takes a few seconds of CPU.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace

import trio
import trio.testing

from swarm.node.gossip import send_heartbeats
from swarm.node.state import Node


@dataclass
class HeartbeatCounts:
    """What the simulated run sent, heard and forgot."""

    peers: int
    seconds: float  # virtual seconds measured, after the warm-up
    published: int = 0  # heartbeats sent by all peers in the measured window
    delivered: int = 0  # heartbeats handed to peers (each publish reaches every other peer)
    forgotten_alive: int = 0  # times a peer forgot another that was still heartbeating
    known_min: int = 0  # the smallest peer table at the end (everyone should know everyone)
    roles_known_by_trainer: dict[str, int] = field(default_factory=dict)  # role -> peers the trainer knows with it

    @property
    def received_per_peer_s(self) -> float:
        return self.delivered / self.peers / self.seconds

    @property
    def sent_per_peer_s(self) -> float:
        return self.published / self.peers / self.seconds

    def to_json(self) -> dict:
        return {"peers": self.peers, "seconds": self.seconds, "published": self.published,
                "delivered": self.delivered, "received_per_peer_s": round(self.received_per_peer_s, 4),
                "sent_per_peer_s": round(self.sent_per_peer_s, 5), "forgotten_alive": self.forgotten_alive,
                "known_min": self.known_min, "roles_known_by_trainer": self.roles_known_by_trainer}


class _Flood:
    """A gossip stand-in for one peer: `publish` hands the heartbeat to every other peer's `heard_from`."""

    def __init__(self, sim: _Swarm, sender: str) -> None:
        self.sim, self.sender = sim, sender

    async def publish(self, kind: str, body: dict) -> None:
        self.sim.deliver(self.sender, tuple(body["roles"]))


class _Versions:
    """Every peer's mirror here: the trainer's newest version, naming the validators the trainer hears (as the
    real trainer names them in each version's run spec)."""

    def __init__(self) -> None:
        self.policies: dict = {}
        self.newest: SimpleNamespace | None = None

    def latest(self) -> SimpleNamespace | None:
        return self.newest

    def publish(self, validators: int) -> None:
        """A new version naming `validators` validators, unless the newest already names that many."""
        if self.newest is not None and self.newest.validators == validators:
            return
        keys = [f"{i:064x}" for i in range(validators)]
        version = 1 if self.newest is None else self.newest.version + 1
        manifest = SimpleNamespace(id=version.to_bytes(8, "big"), model={"run_spec": {"validators": keys}})
        self.newest = SimpleNamespace(version=version, validators=validators, manifest=manifest)


class _Swarm:
    def __init__(self, peers: int, every_s: float, silence_s: float) -> None:
        self.nodes: dict[str, Node] = {}
        self.counts = HeartbeatCounts(peers, 0.0)
        self.measuring = False
        self.versions = _Versions()
        for i in range(peers):
            name = f"p{i:05d}"
            roles = ("trainer",) if i == 0 else ("validator",) if i % 10 == 1 else ("inference",)
            peer = SimpleNamespace(roles=roles, heartbeat_every_s=every_s, peer_silence_s=silence_s)
            config = SimpleNamespace(peer=peer)
            host = SimpleNamespace(peer_id=name, multiaddrs=[f"/ip4/10.0.0.1/tcp/1/p2p/{name}"])
            self.nodes[name] = Node(config, host, _Flood(self, name), self.versions, None, None)

    def deliver(self, sender: str, roles: tuple[str, ...]) -> None:
        now = trio.current_time()
        for name, node in self.nodes.items():
            if name != sender:
                node.heard_from(sender, roles, now)
        if self.measuring:
            self.counts.published += 1
            self.counts.delivered += len(self.nodes) - 1

    def forget(self) -> None:
        now = trio.current_time()
        for node in self.nodes.values():
            self.counts.forgotten_alive += len(node.forget_silent(now))  # every peer here keeps heartbeating

    def publish_version(self) -> None:
        """The trainer (the first peer) publishes a version naming the validators it hears, if they changed."""
        trainer = next(iter(self.nodes.values()))
        self.versions.publish(sum("validator" in roles for roles in trainer.peer_roles.values()))


async def simulate_heartbeats(peers: int, *, every_s: float = 6.0, silence_s: float = 30.0, warmup_s: float = 600.0,
                              seconds: float = 1200.0, start_spread_s: float = 60.0,
                              forget_every_s: float = 2.0) -> HeartbeatCounts:
    """Run `peers` heartbeat loops (joining over `start_spread_s`), then count `seconds` of steady state. Every
    `forget_every_s` each peer forgets the silent ones (a node does so every 2 s; a large run, whose silences
    stretch to many minutes, is simulated faster with a longer step)."""
    sim = _Swarm(peers, every_s, silence_s)
    async with trio.open_nursery() as nursery:
        for i, node in enumerate(sim.nodes.values()):
            nursery.start_soon(_join_later, node, start_spread_s * i / peers)
        nursery.start_soon(_publish_versions, sim, forget_every_s)
        await trio.sleep(warmup_s)
        sim.measuring = True
        started = trio.current_time()
        while trio.current_time() - started < seconds:
            await trio.sleep(forget_every_s)
            sim.forget()
        sim.counts.seconds = trio.current_time() - started
        nursery.cancel_scope.cancel()
    sim.counts.known_min = min(len(node.peer_heard) for node in sim.nodes.values())
    trainer = next(iter(sim.nodes.values()))
    for roles in trainer.peer_roles.values():
        for role in roles:
            sim.counts.roles_known_by_trainer[role] = sim.counts.roles_known_by_trainer.get(role, 0) + 1
    return sim.counts


async def _publish_versions(sim: _Swarm, every_s: float) -> None:
    while True:
        await trio.sleep(every_s)
        sim.publish_version()


async def _join_later(node: Node, delay: float) -> None:
    await trio.sleep(delay)
    await send_heartbeats(node)


def run_heartbeat_sim(peers: int, **kwargs) -> HeartbeatCounts:
    """`simulate_heartbeats` on a virtual clock."""
    return trio.run(lambda: simulate_heartbeats(peers, **kwargs), clock=trio.testing.MockClock(autojump_threshold=0))
