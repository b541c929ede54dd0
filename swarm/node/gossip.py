"""A node's own gossip: heartbeats out, and heartbeats and manifest announcements in.

Every received message arrives as a typed value (swarm.messages.gossip_bodies, decoded by gossip's validator before it
was delivered or forwarded) and is handled in a scope of its own (p2p.gossip.service.Gossip.serve): whatever one message
makes a handler raise drops that message, costs its sender and logs one line; the node goes on. A handler that cannot
use a message raises p2p.gossip.service.Ignored, which costs the sender the same way.
"""

from __future__ import annotations

import logging
import random

import trio

from p2p.errors import P2PError
from p2p.gossip.envelope import Envelope
from p2p.gossip.service import Ignored
from p2p.host.p2p_host import HANDLER_FAULT
from swarm.messages.gossip_bodies import MAX_ADDRS, Heartbeat, ManifestAnnouncement, sendable_progress
from swarm.node.heartbeat_budget import is_counted
from swarm.node.parts import dial_any, run_part
from swarm.node.ports import GossipPort, HostPort
from swarm.node.state import Node
from swarm.policy.manifest_protocol import ManifestFetch, fetch_manifest

log = logging.getLogger(__name__)

MAX_MANIFEST_FETCHES = 8
"""Manifest fetches in flight at once; more ids are skipped (heartbeats name each held version again)."""
HEARTBEAT_REDIAL_S = 30.0
"""A peer a heartbeat made us dial counts against max_peers this long, then only while it stays connected."""
async def receive_manifests(node: Node) -> None:

    await node.gossip.serve("manifest", lambda env: on_manifest(node, env, fetch_manifest))


def on_manifest(node: Node, env: Envelope, fetch_manifest: ManifestFetch) -> None:
    """Adopt an inline manifest, or fetch an announced one in the background (fetched in line, ten announcements
    of ids nobody serves held up the next real manifest for 150 s)."""
    ann = env.decoded(ManifestAnnouncement)
    if ann.signed is None:
        if ann.manifest_id not in node.mirror.policies:
            fetch_manifest_soon(node, env.sender_peer_id, ann.manifest_id, fetch_manifest)
        return
    policy = node.mirror.adopt(ann.signed)
    if policy is not None and (policy.manifest.id, policy.manifest.version) != (ann.manifest_id, ann.version):
        raise Ignored("ignored", "the announced manifest id or version is not the signed manifest's")
    newest = node.mirror.latest()
    if policy is None and (newest is None or ann.version > newest.manifest.version - node.config.mirror.keep_versions):
        raise Ignored("ignored", "the announced manifest was refused")


def fetch_manifest_soon(node: Node, peer: str, manifest_id: bytes, fetch: ManifestFetch) -> None:
    """Fetch and adopt a manifest a peer named, in the background: one fetch per id at a time and at most
    MAX_MANIFEST_FETCHES in all (a flood of announcements must not start a fetch for each)."""

    if manifest_id in node.fetching or len(node.fetching) >= MAX_MANIFEST_FETCHES:
        return
    node.fetching.add(manifest_id)

    async def fetch_once(node: Node) -> None:
        try:
            await fetch_and_adopt(node, peer, manifest_id, fetch)
        finally:
            node.fetching.discard(manifest_id)

    node.nursery.start_soon(run_part, node, fetch_once)


async def fetch_and_adopt(node: Node, peer: str, manifest_id: bytes, fetch: ManifestFetch) -> None:
    try:
        signed = await fetch(node.host, peer, manifest_id)
    except P2PError as exc:
        log.debug("manifest fetch from %s failed: %s", peer, exc)
        return
    if signed is not None:
        node.mirror.adopt(signed)


def share_host_faults(host: HostPort, gossip: GossipPort) -> None:
    """A peer whose streams make this host's handlers fail pays for it in gossip too (p2p.host.p2p_host's fault
    listeners): one accountability, so a peer the host is about to ban for faulting streams is not also relayed and
    forwarded at a clean gossip score. Three faults, which ban it from the host, ban it from gossip as well."""


    def on_fault(peer: str, protocol: str) -> None:
        gossip.penalize(peer, HANDLER_FAULT)

    host.fault_listeners.append(on_fault)


def heartbeat_body(node: Node) -> dict:
    """What this peer says about itself, within what receivers accept
    (swarm.messages.gossip_bodies.decode_heartbeat)."""
    policies = []
    for p in list(node.mirror.policies.values())[-16:]:
        done = p.ready.is_set()
        policies.append([p.manifest.version, p.manifest.id, done])
    body = {"roles": list(node.config.peer.roles)[:4], "addrs": node.host.multiaddrs[:MAX_ADDRS], "policies": policies}
    progress = sendable_progress(node.progress)
    if progress:
        body["progress"] = progress
    return body


HEARTBEAT_JITTER = 0.2
"""Each wait between heartbeats is drawn within this fraction of the period either side. Why: peers that join
together (a flash crowd, a restarted cluster) otherwise heartbeat in the same second for ever: a burst of floods
once a period, and nothing between (16 peers of `swarm bench scale` that joined together delivered no heartbeat in
a 40 s window of their 100 s period)."""


async def send_heartbeats(node: Node) -> None:
    draw = random.Random()
    while True:
        try:
            await node.gossip.publish("heartbeat", heartbeat_body(node))
        except P2PError as exc:
            log.debug("heartbeat not sent: %s", exc)
        # Not every second: a publish costs ~140 ms of CPU among six hosts (p2p.gossip.service), and seven peers
        # heartbeating each second in one simulated process starved its streams. See PeerConfig.heartbeat_every_s;
        # in a large run, longer still (heartbeat_stretch).
        period = node.config.peer.heartbeat_every_s * node.stretch(is_counted(node.config.peer.roles))
        await trio.sleep(period * draw.uniform(1 - HEARTBEAT_JITTER, 1 + HEARTBEAT_JITTER))


async def receive_heartbeats(node: Node) -> None:
    """Learn peers (dial their announced addresses) and manifests we have not seen yet."""

    dialed: dict[str, float] = {}  # peers a heartbeat made us dial -> when
    await node.gossip.serve("heartbeat", lambda env: on_heartbeat(node, env, dialed, fetch_manifest))


def on_heartbeat(node: Node, env: Envelope, dialed: dict[str, float], fetch_manifest: ManifestFetch) -> None:

    beat = env.decoded(Heartbeat)
    sender = env.sender_peer_id
    now = trio.current_time()
    node.heard_from(sender, beat.roles, now)
    connected = node.connected_peers()
    for peer in [p for p, at in dialed.items() if now - at > HEARTBEAT_REDIAL_S and p not in connected]:
        del dialed[peer]  # gone or never reached: its place is free, or throwaway ids would keep it for good
    # Only the larger peer id dials a peer learnt from a heartbeat: two peers dialing each other at once
    # collide under one-connection-per-peer and the streams opened on the losing connection hang.
    # And only while this peer has room: in a large run every peer is heard from, and dialing each would open a
    # connection to all of them.
    if (sender < node.peer_id and sender not in connected and sender not in dialed
            and len(dialed) < node.config.limits.max_peers and len(connected) < node.config.limits.max_peers
            and beat.addrs):
        dialed[sender] = now
        node.nursery.start_soon(run_part, node, dial_any, sender, list(beat.addrs[:4]))
    newest = node.mirror.latest()
    for held in beat.policies:
        if held.manifest_id not in node.mirror.policies and (
                newest is None or held.version > newest.manifest.version - node.config.mirror.keep_versions):
            fetch_manifest_soon(node, sender, held.manifest_id, fetch_manifest)
