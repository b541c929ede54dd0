"""One peer: a libp2p host, the run's gossip, data channels and a policy mirror, plus the roles it plays.

The node owns the IO; decisions live in the sans-IO parts it drives (the swarm engine, the quorum, the
curriculum). Tasks, all in one nursery: announcements in (manifests, heartbeats) and heartbeats out (roles, held
versions, listen addresses: this is how peers that joined through different bootstrap peers find each other; all
in swarm.node.gossip), the link reconciler, progress reports, and one task per role. Gossip carries the run's
kinds only (swarm.messages.gossip_bodies), each typed and checked before it is delivered or forwarded, a peer's
heartbeats at most one per half `heartbeat_every_s`.
"""

from __future__ import annotations

import functools
import logging
import math
import secrets
import time
from collections.abc import Awaitable, Callable, Iterable

import blake3
import trio

from p2p.bootstrap import peer_id_of, resolve_bootstrap
from p2p.channel.service import ChannelConfig, open_data_channel, serve_data_channels
from p2p.dht.service import open_dht
from p2p.errors import P2PError
from p2p.gossip.admission import AdmissionConfig
from p2p.gossip.service import GossipConfig, open_gossip
from p2p.host.conn_trim import TrimConfig, trim_connections
from p2p.host.p2p_host import HostConfig, open_host
from p2p.identity import Identity, peer_id_from_public_bytes
from p2p.pieces.store import PieceStore
from p2p.pieces.wire import Stream
from swarm.config import DHT_PROVIDERS_WANTED, PeerConfig
from swarm.errors import usable_directory
from swarm.event_types import (
    BootstrapReconnected,
    BootstrapUnreachable,
    DhtFound,
    Listening,
    PeerGone,
)
from swarm.events import EventSink
from swarm.messages.gossip_bodies import DECODERS, run_decoders
from swarm.node.gossip import (
    fetch_and_adopt,
    receive_heartbeats,
    receive_manifests,
    send_heartbeats,
    share_host_faults,
)
from swarm.node.metrics import serve_node_metrics
from swarm.node.parts import dial_any, run_part
from swarm.node.ports import HostPort
from swarm.node.reports import report_progress
from swarm.node.state import DHT_PUT_LIMIT_S, Node, RoleTask
from swarm.node.watchdogs import reach_bootstrap, watch_trainer_key
from swarm.policy.manifest_protocol import fetch_manifest, install_manifest_server
from swarm.policy.mirror import PolicyMirror
from swarm.policy.mirrored import MirroredPolicy
from swarm.policy.trust import TrainerTrust
from swarm.shutdown import TEARDOWN_GRACE_S, report_stuck_tasks

log = logging.getLogger(__name__)
DHT_QUIET_MAX_S = 320.0
"""Longest wait between two DHT lookups for the run's latest manifest while no version arrives."""


async def open_node_parts(config: PeerConfig, identity: Identity, events: EventSink, roles: list[RoleTask],
                          trust_key: bytes | None = None,
                          on_stopping: Callable[[Node], None] = lambda node: None) -> int:
    """Build host, gossip, store and mirror, run until cancelled, `done` or a role finishes; returns exit status.

    Teardown is bounded (swarm.shutdown): `on_stopping` is called once the peer's work is over, and whatever of
    closing the network still waits after TEARDOWN_GRACE_S is cancelled."""

    bootstrap = resolve_bootstrap(
        config.peer.bootstrap or None, None, config.peer.bootstrap_file if config.peer.bootstrap_file.exists() else None
    )
    usable_directory(config.peer.data_dir, "data directory")
    built: list[Node] = []  # the node once it exists: its `failed` flag is the exit status
    closed = trio.Event()
    try:
        with trio.CancelScope() as teardown:
            await _serve(config, identity, events, roles, trust_key, bootstrap, built, teardown, closed, on_stopping)
    finally:
        closed.set()
    if teardown.cancelled_caught:
        log.warning("closing the network took over %.0f s; stopped waiting for it", TEARDOWN_GRACE_S)
    return 1 if not built or built[0].failed else 0


async def _serve(config: PeerConfig, identity: Identity, events: EventSink, roles: list[RoleTask],
                 trust_key: bytes | None, bootstrap: tuple[str, ...], built: list[Node], teardown: trio.CancelScope,
                 closed: trio.Event, on_stopping: Callable[[Node], None]) -> None:
    """open_node_parts' body; `teardown` is the scope whose deadline bounds closing, `closed` is set once closed."""
    with PieceStore(config.peer.data_dir / "store", keep_versions=config.mirror.keep_versions) as store:
        trust = TrainerTrust(config.peer.run, trust_key, config.peer.data_dir, config.peer.wrong_key_timeout_s)
        upload = config.limits.upload_mbps * 1e6 / 8 if config.limits.upload_mbps > 0 else math.inf
        async with open_host(HostConfig(identity=identity, data_dir=config.peer.data_dir, listen=config.peer.listen,
                                        announce=config.peer.announce, reach=config.reach_config(),
                                        bootstrap=bootstrap, inbound=config.limits.inbound_limits())) as host:
            for addr, why in host.bootstrap_failures.items():
                events.emit(BootstrapUnreachable(address=addr, reason=why))
            mirror = PolicyMirror(store, host.peer_id, trust, run=config.peer.run, upload_bps=upload,
                                  reseed=config.mirror.reseed, keep=config.mirror.keep_versions, on_event=events.emit,
                                  copies_dir=config.peer.data_dir / "policies",
                                  links_per_version=config.mirror.links_per_version)
            admission = AdmissionConfig(heartbeat_interval_s=config.peer.heartbeat_every_s / 2)
            async with open_gossip(host, config.peer.run, identity, kinds=tuple(DECODERS),
                                   decoders=run_decoders(lambda: trust.key),
                                   config=GossipConfig(admission=admission)) as gossip, open_dht(host) as dht, \
                    trio.open_nursery() as nursery:
                node = Node(config, host, gossip, mirror, events, nursery, dht=dht)
                built.append(node)
                share_host_faults(host, gossip)
                events.listeners.append(node.note_progress)
                if config.peer.metrics_port:
                    await nursery.start(serve_node_metrics, node)
                await nursery.start(mirror.run_service)
                await nursery.start(serve_data_channels, host, mirror.accept_link,
                                    ChannelConfig(exempt_loopback=config.limits.data_exempt_loopback))
                install_manifest_server(
                    host, lambda mid: mirror.policies[mid].signed if mid in mirror.policies else None
                )
                events.emit(Listening(peer_id=host.peer_id, addrs=host.multiaddrs, roles=list(config.peer.roles)))
                for part, *args in [(receive_manifests,), (receive_heartbeats,), (send_heartbeats,),
                                    (_forget_silent_peers,), (_keep_bootstrap_links, tuple(bootstrap)),
                                    (_reconcile_links, open_data_channel), (report_progress,), (_provide_held,),
                                    (_find_latest_on_dht,), (_trim_connections, tuple(bootstrap)),
                                    (reach_bootstrap, tuple(bootstrap)), (watch_trainer_key,),
                                    *((role,) for role in roles)]:
                    nursery.start_soon(run_part, node, part, *args)
                await node.done.wait()
                on_stopping(node)
                trio.lowlevel.spawn_system_task(report_stuck_tasks, TEARDOWN_GRACE_S / 2, closed, log)
                teardown.deadline = trio.current_time() + TEARDOWN_GRACE_S
                nursery.cancel_scope.cancel()


async def _trim_connections(node: Node, bootstrap: tuple[str, ...]) -> None:
    """Keep this peer's libp2p connections near `max_peers`, and never fewer than a full gossip mesh
    (p2p.host.conn_trim): our gossip mesh, our data links, the trainer, bootstrap peers, relays either way and
    connections with a stream open other than gossip's are in use; of the rest, some close once there are too many.
    Without it, a peer of a large run would hold connections to everyone its DHT lookups ever asked."""
    bootstrap_peers = set(map(peer_id_of, bootstrap))

    def in_use() -> set[str]:
        kept = node.host.peers_in_use() | node.gossip.mesh_peers() | node.mirror.linked_peers() | bootstrap_peers
        key = node.mirror.trust.key
        return kept | {peer_id_from_public_bytes(key)} if key is not None else kept

    keep = max(node.config.limits.max_peers, 2 * GossipConfig().degree)  # room for a full gossip mesh at least
    await trim_connections(node.host.connected_peers, in_use, node.host.disconnect, TrimConfig(keep=keep))


async def _keep_bootstrap_links(node: Node, bootstrap: tuple[str, ...]) -> None:
    """Redial, every `bootstrap_redial_s`, each bootstrap peer this peer is not connected to.

    Why: the bootstrap peer is often the trainer, and a trainer restarts (a crash, an upgrade) on its address.
    Nothing dialed it back: with three processes, its validator and workers found it again only when the DHT
    refreshed its routing table about a minute later, and until then it heard no validator and published nothing.
    A peer started before its bootstrap peer was up stayed alone for good the same way.
    """

    wanted = {addr: peer_id_of(addr) for addr in bootstrap}
    while True:
        await trio.sleep(node.config.peer.bootstrap_redial_s)
        for addr, peer in wanted.items():
            if peer == node.peer_id or peer in node.connected_peers():
                continue
            try:
                await node.host.redial(addr)
            except P2PError as exc:
                log.debug("bootstrap peer %s still unreachable: %s", addr, exc, exc_info=True)
            else:
                node.events.emit(BootstrapReconnected(address=addr, message=f"connected to bootstrap peer {addr}"))


async def _forget_silent_peers(node: Node) -> None:
    while True:
        await trio.sleep(node.config.peer.status_every_s)
        for peer, roles in node.forget_silent(trio.current_time()).items():
            node.events.emit(PeerGone(peer=peer, roles=list(roles), message=(
                f"{', '.join(roles) or 'peer'} {peer} sent no heartbeat for {node.config.peer.peer_silence_s:g} s; "
                f"its roles no longer count")))


async def _provide_held(node: Node) -> None:
    """Announce on the DHT the manifest id of every version we mirror, if this peer signed it or is one of its
    sampled providers (`provides_key`), and stop re-announcing those of versions we dropped: the DHT re-announces
    every key it was given at each re-provide, so without the second half a long run announced every version it
    ever held, ever more of them, long after their files were deleted."""
    salt = secrets.token_bytes(16)  # this process's own draw: nobody can tell in advance which peers provide
    provided: set[bytes] = set()
    while True:
        changed = node.mirror.changed  # taken first: a change while we announce wakes the next wait at once
        held = held_keys(node.mirror.policies.values())
        own = {p.manifest.id for p in node.mirror.policies.values() if p.origin == node.peer_id}
        for key in provided - set(held):
            node.dht.unprovide(key)
            provided.discard(key)
        for key in held:
            if key not in provided and (key in own or provides_key(key, salt, len(node.peer_heard),
                                                                  node.config.mirror.dht_providers)):
                provided.add(key)
                try:
                    await node.dht.provide(key)
                except P2PError as exc:
                    log.debug("provide failed: %s", exc)
        await changed.wait()


def held_keys(policies: Iterable[MirroredPolicy]) -> list[bytes]:
    """The DHT keys of the policies we mirror: each manifest id, in the policies' order. Only manifest ids are
    looked up (`_adopt_latest_from_dht`), so the files' roots are not announced: they would double the cost."""
    return list(dict.fromkeys(policy.manifest.id for policy in policies))


def provides_key(key: bytes, salt: bytes, peers_known: int, wanted: float = DHT_PROVIDERS_WANTED) -> bool:
    """Whether this peer announces itself on the DHT as a provider of `key`: every peer in a run of up to `wanted`
    peers, otherwise each with probability wanted / peers, drawn from the key and this process's secret salt.

    Why: the DHT keeps a key's providers on the 20 peers closest to it, and each announcement is a lookup of a
    dozen or more streams plus a store on those 20. With every peer of a 1,000-peer run announcing every version,
    each of those 20 peers would take 1,000 stores a version and every peer pay a lookup a version, for a list of which
    a joiner reads at most a few entries (`_adopt_latest_from_dht`). About `wanted` providers are drawn afresh for
    each version, so no peer is the only way to any version.
    """
    if peers_known < wanted:
        return True
    draw = int.from_bytes(blake3.blake3(salt + key).digest()[:8], "big") / 2**64
    return draw < wanted / (peers_known + 1)


async def _find_latest_on_dht(node: Node, every_s: float = 10.0, quiet_s: float = 20.0,
                              quiet_max_s: float = DHT_QUIET_MAX_S) -> None:
    """Ask the DHT for the run's latest manifest whenever no new version has arrived for a while.

    Why besides gossip and heartbeats: a peer whose bootstrap node knows nothing of the run (or whose gossip mesh
    has not formed) still finds the newest policy and its providers through the DHT; and a peer that missed a new
    version's announcement (gossip streams time out on a loaded machine, which can leave every peer a version
    behind the trainer) finds it here instead of waiting for ever.

    The wait doubles after every lookup that brings nothing new, up to `quiet_max_s`, and starts again at `quiet_s`
    when the mirror changes: a lookup opens a stream to each of a dozen or more peers and makes them answer, and in
    a swarm that is between versions, asking every 20 s is a third of an idle peer's CPU.
    """
    quiet = quiet_s
    while True:
        wait = every_s if node.mirror.latest() is None else quiet
        with trio.move_on_after(wait) as silence:
            await node.mirror.changed.wait()
        if not silence.cancelled_caught:
            quiet = quiet_s
            continue
        newest = node.mirror.latest()
        if node.mirror.trust.key is not None:
            with trio.move_on_after(DHT_PUT_LIMIT_S):
                await _adopt_latest_from_dht(node)
        quiet = next_quiet_wait(quiet, quiet_max_s) if node.mirror.latest() is newest else quiet_s


def next_quiet_wait(wait: float, most: float) -> float:
    """The wait before the next DHT lookup after one that found nothing new: twice the last, at most `most`."""
    return min(2 * wait, most)


async def _adopt_latest_from_dht(node: Node) -> None:

    newest = node.mirror.latest()
    try:
        record = await node.dht.get_latest_manifest(node.config.peer.run, node.mirror.trust.key)
        if record is None or record.manifest_id in node.mirror.policies or (
                newest is not None and record.version <= newest.manifest.version):
            return
        providers = await node.dht.find_providers(record.manifest_id)
    except P2PError as exc:
        log.debug("DHT lookup failed: %s", exc)
        return
    node.events.emit(DhtFound(version=record.version, providers=len(providers)))
    for provider in providers[:4]:
        await dial_any(node, provider.peer_id, list(provider.multiaddrs)[:4])
        await fetch_and_adopt(node, provider.peer_id, record.manifest_id, fetch_manifest)
        if record.manifest_id in node.mirror.policies:
            break
    node.mirror.note_providers(record.manifest_id, [provider.peer_id for provider in providers])


async def _reconcile_links(node: Node, open_data_channel: Callable[[HostPort, str], Awaitable[Stream]]) -> None:
    dial = functools.partial(open_data_channel, node.host)  # a peer id -> its data channel
    while True:
        changed = node.mirror.changed  # taken first: a version adopted during the round wakes the next at once
        await node.mirror.reconcile(node.connected_peers(), dial, node.config.limits.max_peers)
        with trio.move_on_after(node.mirror.reconcile_pause()):
            await changed.wait()


def wall_clock() -> float:
    """Monotonic seconds comparable across processes on one machine (for benchmark timestamps)."""
    return time.monotonic()
