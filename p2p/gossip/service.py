"""GossipSub per run: signed envelopes on one topic per kind, verified before they are delivered or forwarded.

Topics are f"/rlswarm/{run}/{kind}". Every message is a sealed envelope (p2p.gossip.envelope); a validator hooked into
py-libp2p's pubsub (p2p.gossip.validator) checks the sender's allowance (p2p.gossip.admission: per-peer rates and
decode budgets, and one for the whole node), then runs `open_envelope` and the kind's typed decoder on it, so a
flooding, malformed, forged, stale, replayed, oversized, wrong-run or mistyped message is rejected before delivery
and is never forwarded (py-libp2p forwards only after every validator said yes); its sender is scored down
(p2p.scores) and, past the threshold, banned: blacklisted in pubsub and hung up on until its ban ends
(p2p.gossip.penalties). `Gossip` keeps the session: publishing, subscribing, serving handlers, the pubsub streams and
their upkeep; it composes the validator and the penalties, and lends them what the session holds.

py-libp2p 0.8.1 pitfalls handled here (docs/reference.md#py-libp2p-pitfalls):
- the 120 s default heartbeat (and the "adaptive" mode that stretches it to 30-60 s) makes meshes form and heal in
  minutes: heartbeat ~1 s, adaptive mode off;
- messages of 1 MiB and more vanish silently: `publish` refuses envelopes above GOSSIP_MAX_BYTES (900 KiB) with a
  GossipError, and the caller announces the payload by hash instead (kind "rollout_ann");
- the router drops, per forwarding peer and topic, everything above `max_messages_per_topic_per_second` (10/s by
  default, checked on our own publishes too): we set the limit explicitly and pace our own publishes below it;
- subscription queues hold 32 messages and drop the rest: one task per topic drains them continuously into our
  own larger, bounded channels;
- per-peer outbound queues hold 32 RPCs and drop the rest (a publish costs two): `publish` waits while any peer
  of the topic has a half-full queue (bounded), so bursts slow down instead of vanishing;
- `equivocation_detection` keeps every message it ever saw (the full bytes) until a heartbeat trims it: it is
  replaced by a map that stores nothing. Replays are caught by our own bounded (sender, seq) filter instead.
- a refused message's verdict is cached by its id, and every copy sent again is refused from that cache without
  our validator (so without scoring its sender) but with the whole message formatted into the error's text
  (protobuf text format: about 70 ms for 900 KiB): the cache is replaced by one that remembers nothing (accepted
  messages are dropped as seen before validation anyway), and our validator empties what it refuses;
- connections made before gossip started fire no notifee: a maintenance tick opens pubsub streams to them;
- pubsub's stream handler is installed unguarded: we re-install it behind the host's guard;
- small messages cost about 140 ms of CPU per publish among 6 fully meshed hosts (IDONTWANT for every message,
  a signed peer record verified twice on every RPC): past the CPU a process gets, streams between its hosts stop
  opening. p2p.gossip.pubsub's LeanGossipSub sends IDONTWANT only for messages of 1 KiB and more, and its
  LeanPubsub the record once per stream.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Mapping

import trio
from libp2p.abc import INetStream, ISubscriptionAPI
from libp2p.peer.id import ID
from libp2p.pubsub.gossipsub import PROTOCOL_ID, PROTOCOL_ID_V11, PROTOCOL_ID_V12
from libp2p.tools.anyio_service import background_trio_service

from p2p.errors import EnvelopeError, GossipError
from p2p.gossip.admission import AdmissionConfig, OwnPace
from p2p.gossip.envelope import (
    DEFAULT_POLICY,
    GOSSIP_MAX_BYTES,
    KINDS,
    Envelope,
    EnvelopePolicy,
    open_envelope,
    seal,
)
from p2p.gossip.parts import GossipStats, PublishPacer, Rejection, _NeverStored, _NoValidationCache
from p2p.gossip.penalties import GossipPenalties, Ignored
from p2p.gossip.pubsub import BufferedInboundStream, LeanGossipSub, LeanPubsub
from p2p.gossip.validator import BodyDecoder, GossipValidator
from p2p.host.p2p_host import P2PHost, reset_quietly
from p2p.identity import Identity
from p2p.packed import Packed
from p2p.scores import PeerScores, ScoreConfig

__all__ = ["BodyDecoder", "Gossip", "GossipConfig", "GossipStats", "Ignored", "PublishPacer", "Rejection",
           "open_gossip", "topic_for"]

log = logging.getLogger(__name__)
OUTBOUND_QUEUE_HIGH_WATER = 16  # py-libp2p's per-peer outbound queue holds 32 RPCs (rpc_queue.OutBoundQueueSize)
BACKPRESSURE_POLL_S = 0.005
STREAM_RETRY_S = 10.0
MAINTAIN_EVERY_S = 5.0
"""Seconds between two rounds of `Gossip._maintain`, or fewer when a connected peer's next pubsub-stream attempt is
due sooner (a peer that joined as we did may have refused py-libp2p's first try), and a heartbeat after a peer
opened pubsub to us first. Why not every heartbeat: lifting a ban of minutes waits well on a few seconds, and a
stream attempt is made every STREAM_RETRY_S at most, while every periodic wake-up of an idle peer also costs the
scheduler a pass (about 0.02 % of a core at once a second)."""


def topic_for(run: str, kind: str) -> str:
    return f"/rlswarm/{run}/{kind}"


@dataclass(frozen=True)
class GossipConfig:
    """GossipSub settings for one run. Times are seconds; rates are messages per second per topic."""

    heartbeat_s: float = 1.0
    """Mesh maintenance period (py-libp2p defaults to 120 s, far too slow for meshes to form)."""
    degree: int = 6
    """Target mesh degree D (degree_low = D - 2, degree_high = D + 2). Why not gossipsub's usual 2 D for the high
    mark: py-libp2p accepts every inbound GRAFT and prunes only past the high mark, so meshes sit well above D (8.6
    peers on average at 64 peers with 12), and every flooded message costs each peer a copy to and from each."""
    publish_rate: float = 40.0
    """Our own publishes per topic per second; `publish` waits rather than exceed it (batch frequent updates)."""
    router_rate_limit: float = 200.0
    """py-libp2p's per-forwarder, per-topic drop threshold (default 10). A relay forwards every origin's messages
    under its own id, so this must cover the whole swarm's traffic on a topic, and stay above `publish_rate`."""
    queue_size: int = 256
    """Verified envelopes buffered per subscriber channel; a slow consumer loses the newest beyond this."""
    policy: EnvelopePolicy = DEFAULT_POLICY
    """What envelopes we accept (sizes per kind, freshness window)."""
    scores: ScoreConfig = field(default_factory=ScoreConfig)
    """How rejected envelopes count against the peer that forwarded them."""
    replay_capacity: int = 100_000
    """Most (sender, seq) pairs remembered inside the freshness window."""
    backpressure_max_s: float = 5.0
    """Longest a publish waits for a slow peer's outbound queue to drain before letting py-libp2p drop for it."""
    admission: AdmissionConfig = field(default_factory=AdmissionConfig)
    """Per-sender rate limits and decode budgets, applied before a received message is decoded."""

    def __post_init__(self) -> None:
        if self.heartbeat_s <= 0 or self.degree < 2 or self.queue_size < 1 or self.replay_capacity < 1:
            raise GossipError("heartbeat_s, degree (>= 2), queue_size and replay_capacity must be positive")
        if not 0 < self.publish_rate < self.router_rate_limit:
            raise GossipError("publish_rate must be positive and below router_rate_limit (libp2p drops the excess)")


class Gossip:
    """A running gossip session for one run. Build it with `open_gossip`.

    Its parts each own their state: `validator` (p2p.gossip.validator) the checks on every received message and
    the envelopes they verified, `penalties` (p2p.gossip.penalties) the scores and bans of peers. The session keeps
    pubsub, our publishing pace, the subscribers' channels and the pubsub streams' upkeep.
    """

    def __init__(self, host: P2PHost, run: str, identity: Identity, kinds: tuple[str, ...],
                 config: GossipConfig, clock: Callable[[], float],
                 decoders: Mapping[str, BodyDecoder] | None = None) -> None:
        self.host = host
        self.run = run
        self.identity = identity
        self.kinds = kinds
        self.config = config
        self.clock = clock
        self.stats = GossipStats()
        self._nursery: trio.Nursery | None = None  # where bans disconnect peers (set while the session runs)
        self.pubsub: LeanPubsub | None = None
        self._pacer = PublishPacer(config.publish_rate)
        self._own_pace = OwnPace(config.admission)
        self._seq = 0
        self._channels: dict[str, list[trio.MemorySendChannel[Envelope]]] = {k: [] for k in kinds}
        self._stream_retry_at: dict[ID, float] = {}  # connected peer -> earliest next pubsub-stream attempt
        self._stream_wanted = trio.Event()  # a peer opened pubsub to us before we did: wakes `_maintain`
        self._closing = False  # set when the session ends: pubsub streams still arriving are reset quietly
        # pubsub, the nursery and `_closing` are set after this, so the parts are lent ways to read them when used
        self.penalties = GossipPenalties(
            host, config.scores, self.stats, config.queue_size,
            blacklist=lambda peer_id: self.pubsub.add_to_blacklist(peer_id),
            unblacklist=lambda peer_id: self.pubsub.remove_from_blacklist(peer_id),
            session_nursery=lambda: None if self._closing else self._nursery)
        self.validator = GossipValidator(
            run, clock, config.policy, config.admission, config.replay_capacity,
            4 * config.queue_size * max(1, len(kinds)), decoders,
            me=lambda: self.host.libp2p.get_id(), refuse=self.penalties.reject_message)
        # `rejections`: a bounded feed of refused envelopes for logs/status (the newest are dropped when unread).
        self.rejections: trio.MemoryReceiveChannel[Rejection] = self.penalties.rejections

    @property
    def scores(self) -> PeerScores:
        """Every peer's score and ban (owned by `penalties`)."""
        return self.penalties.scores

    # ---- public API -------------------------------------------------------------------------------------------

    async def publish(self, kind: str, body: Packed) -> Envelope:
        """Seal `body` as a `kind` envelope and publish it; returns the envelope sent.

        Raises GossipError when the envelope would exceed GOSSIP_MAX_BYTES or its kind's limit (announce it by
        hash instead) or the kind is unknown. Waits, rather than let py-libp2p drop it, when we publish faster than
        `publish_rate` on this topic or a peer's outbound queue is half full (at most `backpressure_max_s`), and
        rather than let receivers refuse it, when we publish faster than their admission allows (`OwnPace`).
        """
        data = self._seal(kind, body)
        topic = topic_for(self.run, kind)
        while (wait := max(self._pacer.delay(topic, trio.current_time()),
                           self._own_pace.delay(kind, len(data), trio.current_time()))) > 0:
            await trio.sleep(wait)
        self._pacer.record(topic, trio.current_time())
        self._own_pace.record(kind, len(data), trio.current_time())
        await self._wait_for_outbound_room(topic)
        await self.pubsub.publish(topic, data)
        self.stats.published += 1
        self.stats.bytes_published += len(data)
        return open_envelope(data, self.run, self.clock(), self.config.policy)

    def subscribe(self, kind: str) -> trio.MemoryReceiveChannel[Envelope]:
        """A new channel of verified `kind` envelopes from other peers (our own publishes are not echoed).

        Each call gets its own channel; close it when done. A consumer that falls `queue_size` behind loses the
        newest messages (counted in stats.dropped_slow_consumer) instead of stalling gossip for everyone.
        """
        if kind not in self._channels:
            raise GossipError(f"gossip was opened for kinds {', '.join(self.kinds)}; {kind!r} is not among them")
        send, receive = trio.open_memory_channel[Envelope](self.config.queue_size)
        self._channels[kind].append(send)
        return receive

    def topic_peers(self, kind: str) -> list[str]:
        """Peer ids known to be subscribed to `kind` on this run."""
        peers = self.pubsub.peer_topics.get(topic_for(self.run, kind), ())
        return sorted(str(p) for p in peers)

    def mesh_peers(self) -> set[str]:
        """Peers in our mesh on any topic of this session: the ones we forward every message to at once."""
        return {str(peer) for peers in list(self.pubsub.router.mesh.values()) for peer in peers}

    def mean_mesh_size(self) -> float:
        """Peers per topic mesh on average: how many each delivery is forwarded to at once (0 before any mesh)."""
        meshes = [len(peers) for peers in list(self.pubsub.router.mesh.values())]
        return sum(meshes) / len(meshes) if meshes else 0.0

    async def wait_for_topic_peer(self, peer_id: str, kind: str, timeout: float = 10.0) -> None:
        """Return once `peer_id` has subscribed to `kind` (enough for our own publishes to reach it);
        trio.TooSlowError after `timeout`."""
        await self.pubsub.wait_for_subscription(ID.from_base58(peer_id), topic_for(self.run, kind), timeout)

    async def wait_for_mesh(self, peer_id: str, kind: str, timeout: float = 10.0) -> None:
        """Return once `peer_id` is in our mesh for `kind` (from then on we also forward others' messages to it
        at once, not only by gossip at the next heartbeat); trio.TooSlowError after `timeout`."""
        await self.pubsub.wait_for_mesh(ID.from_base58(peer_id), topic_for(self.run, kind), timeout)

    def banned_peers(self) -> list[str]:
        return self.penalties.banned_peers()

    def penalize(self, peer: str, reason: str) -> None:
        """Score `peer` (its base58 peer id) down for content that proved false after the envelope checks passed
        (p2p.gossip.penalties.GossipPenalties.penalize says why), bans included."""
        self.penalties.penalize(peer, reason)

    async def serve(self, kind: str, handle: Callable[[Envelope], Awaitable[None] | None]) -> None:
        """Call `handle(env)` on every `kind` envelope, each in a scope of its own: an exception raised for one
        message (an input nobody foresaw, or `Ignored` from a handler that could not use it) drops that message,
        costs its sender and logs one line; the loop, the role and the node go on."""
        async with self.subscribe(kind) as inbox:
            async for env in inbox:
                try:
                    outcome = handle(env)
                    if hasattr(outcome, "__await__"):
                        await outcome
                except Exception as exc:  # noqa: BLE001 - one peer's message never ends the node
                    self.contain(env, exc)

    def contain(self, env: Envelope, exc: BaseException) -> None:
        """Drop what `env` caused: penalise its sender and log one line (no traceback is kept)."""
        self.penalties.contain(env, exc)

    # ---- internals -------------------------------------------------------------------------------------------

    async def _wait_for_outbound_room(self, topic: str) -> None:
        """Back-pressure: py-libp2p queues at most 32 RPCs per peer and silently drops the rest, and each publish
        costs two (the message and an IDONTWANT). Wait, up to `backpressure_max_s`, until every peer of `topic`
        has its queue at most half full, so a burst slows down to the pace of the slowest peer instead of losing
        messages; a peer stuck beyond that bound is left to py-libp2p's drop."""
        deadline = trio.current_time() + self.config.backpressure_max_s
        while trio.current_time() < deadline:
            queues = [self.pubsub.peer_queues.get(p) for p in self.pubsub.peer_topics.get(topic, ())]
            if all(q is None or len(q) < OUTBOUND_QUEUE_HIGH_WATER for q in queues):
                return
            self.stats.backpressure_waits += 1
            await trio.sleep(BACKPRESSURE_POLL_S)

    def _seal(self, kind: str, body: Packed) -> bytes:
        if kind not in KINDS:
            raise GossipError(f"unknown gossip kind {kind!r}; expected one of {', '.join(KINDS)}")
        now = self.clock()
        self._seq = max(self._seq + 1, int(now * 1e6))  # survives restarts without reusing a (sender, seq)
        try:
            data = seal(kind, self.run, body, self.identity, now, self._seq, self.config.policy)
        except EnvelopeError as exc:
            raise GossipError(f"cannot publish {kind}: {exc} (announce large payloads by hash)") from exc
        if len(data) > GOSSIP_MAX_BYTES:
            raise GossipError(f"a {kind} message of {len(data)} bytes exceeds gossip's {GOSSIP_MAX_BYTES}-byte "
                              "limit; announce it by hash instead")
        return data

    async def _drain(self, kind: str, subscription: ISubscriptionAPI) -> None:
        """Move verified messages from py-libp2p's 32-slot queue to our channels, without ever blocking on them."""
        me = ID.from_base58(self.host.peer_id).to_bytes()  # compared as bytes: no base58 per message
        async for msg in subscription:
            env = self.validator.take_verified(msg)
            if env is None or bytes(msg.from_id) == me:
                continue
            self.stats.delivered += 1
            self.stats.bytes_delivered += len(msg.data)
            for channel in list(self._channels[kind]):
                try:
                    channel.send_nowait(env)
                except trio.WouldBlock:
                    self.stats.dropped_slow_consumer += 1
                except (trio.ClosedResourceError, trio.BrokenResourceError):
                    self._channels[kind].remove(channel)

    async def _maintain(self, nursery: trio.Nursery) -> None:
        """Lift ended bans, and open pubsub streams to connected peers pubsub never heard of (MAINTAIN_EVERY_S says
        how often)."""
        while True:
            self.penalties.lift_ended_bans(trio.current_time())
            next_attempt = self._open_missing_streams(nursery)
            self._stream_wanted = trio.Event()
            with trio.move_on_after(max(self.config.heartbeat_s, min(next_attempt, MAINTAIN_EVERY_S))):
                await self._stream_wanted.wait()
                await trio.sleep(self.config.heartbeat_s)  # ours follows at the next heartbeat

    def _open_missing_streams(self, nursery: trio.Nursery) -> float:
        """Start one pubsub-stream attempt per connected peer that has none, at most every STREAM_RETRY_S (a peer
        that does not speak pubsub must not cost a stream per heartbeat); seconds until the next attempt is due
        (infinite when every connected peer has its stream or is banned)."""
        now, connected = trio.current_time(), set(self.host.libp2p.get_connected_peers())
        for peer_id in list(self._stream_retry_at):
            if peer_id not in connected:
                del self._stream_retry_at[peer_id]
        next_due = math.inf
        for peer_id in connected:
            if peer_id in self.pubsub.peers or self.pubsub.is_peer_blacklisted(peer_id):
                continue
            if self._stream_retry_at.get(peer_id, now) <= now:
                self._stream_retry_at[peer_id] = now + STREAM_RETRY_S
                nursery.start_soon(self._ensure_stream, peer_id)
            next_due = min(next_due, self._stream_retry_at[peer_id])
        return next_due - now

    async def _inbound_stream(self, stream: INetStream) -> None:
        """A peer opened pubsub to us: it speaks pubsub now, so our own stream to it is due at the next tick."""
        peer_id = stream.muxed_conn.peer_id
        if self.pubsub.is_peer_blacklisted(peer_id):  # a banned peer that dialed back is not read at all
            await reset_quietly(stream)
            return
        if peer_id not in self.pubsub.peers:
            self._stream_retry_at.pop(peer_id, None)
            self._stream_wanted.set()
        try:
            await self.pubsub.stream_handler(BufferedInboundStream(stream))
        except RuntimeError:  # py-libp2p's service refuses new tasks once it is closing ("Nursery is closed")
            if not self._closing:
                raise
            log.debug("pubsub stream from %s arrived while this session closed", peer_id)
            await reset_quietly(stream)

    async def _ensure_stream(self, peer_id: ID) -> None:
        try:
            await self.pubsub.ensure_peer_stream(peer_id, timeout=5 * self.config.heartbeat_s)
        except Exception:  # noqa: BLE001 - a peer that will not talk pubsub is simply retried later
            log.debug("no pubsub stream to %s yet", peer_id, exc_info=True)


def gossip_router(config: GossipConfig) -> LeanGossipSub:
    """py-libp2p's router for `config`, minus the CPU that starved streams (p2p.gossip.pubsub)."""
    return LeanGossipSub(
        protocols=[PROTOCOL_ID_V12, PROTOCOL_ID_V11, PROTOCOL_ID],
        degree=config.degree,
        degree_low=max(1, config.degree - 2),
        degree_high=config.degree + 2,
        heartbeat_interval=config.heartbeat_s,  # type: ignore[arg-type] - py-libp2p only ever sleeps on it
        heartbeat_initial_delay=min(0.1, config.heartbeat_s),
        adaptive_gossip_enabled=False,
        max_messages_per_topic_per_second=config.router_rate_limit,
    )


def _build_pubsub(host: P2PHost, config: GossipConfig) -> tuple[LeanPubsub, LeanGossipSub]:
    router = gossip_router(config)
    router.equivocation_detection = _NeverStored()
    window = config.policy.max_age_s + config.policy.max_future_s
    # seen_ttl covers our freshness window, so honest re-deliveries are dropped as duplicates by pubsub itself and
    # only a deliberately re-published envelope ever reaches our replay filter (and costs its forwarder).
    pubsub = LeanPubsub(host.libp2p, router, seen_ttl=int(window) + 1, strict_signing=True)
    pubsub.validation_cache = _NoValidationCache()
    return pubsub, router


@asynccontextmanager
async def open_gossip(
    host: P2PHost, run: str, identity: Identity | None = None, *, kinds: tuple[str, ...] = KINDS,
    config: GossipConfig | None = None, clock: Callable[[], float] = time.time,
    decoders: Mapping[str, BodyDecoder] | None = None,
) -> AsyncIterator[Gossip]:
    """Join the run's gossip on a started host (p2p.host.p2p_host.P2PHost) and yield a `Gossip`; leave it on exit.

    `identity` signs our envelopes (default: the host's key). `clock` gives wall-clock seconds for envelope
    timestamps and freshness checks (peers compare them, so it must be real time in production; tests inject
    trio's clock). All topics in `kinds` are subscribed at once and drained continuously. `decoders` gives a
    typed decoder per kind (swarm.messages.gossip_bodies): what one refuses is dropped before delivery and forwarding
    and costs its sender; a kind without one delivers any well-formed body.
    """
    unknown = set(kinds) - set(KINDS)
    if unknown or not kinds:
        raise GossipError(f"unknown gossip kinds {sorted(unknown)}; expected some of {', '.join(KINDS)}")
    config = config or GossipConfig()
    gossip = Gossip(host, run, identity or host.identity, tuple(kinds), config, clock, decoders)
    gossip.pubsub, router = _build_pubsub(host, config)
    gossip.pubsub.on_forged = lambda peer: gossip.penalize(str(peer), "bad_signature")
    for protocol in router.get_protocols():  # an exception in pubsub's reader must not kill the host
        host.set_guarded_handler(protocol, gossip._inbound_stream, timeout=None)
    async with background_trio_service(gossip.pubsub), background_trio_service(router):
        await gossip.pubsub.wait_until_ready()
        async with trio.open_nursery() as nursery:
            for kind in kinds:
                topic = topic_for(run, kind)
                gossip.pubsub.set_topic_validator(topic, gossip.validator.for_kind(kind), is_async_validator=False)
                nursery.start_soon(gossip._drain, kind, await gossip.pubsub.subscribe(topic))
            nursery.start_soon(gossip._maintain, nursery)
            gossip._nursery = nursery
            try:
                yield gossip
            finally:
                gossip._closing = True
                for protocol in router.get_protocols():  # a peer opening pubsub now is told "not supported"
                    host.remove_handler(protocol)  # instead of hitting a service that is shutting down
                nursery.cancel_scope.cancel()
                for channels in gossip._channels.values():
                    for channel in channels:
                        channel.close()
