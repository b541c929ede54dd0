"""py-libp2p's pubsub minus the CPU it spends per gossip message: `LeanGossipSub` and `LeanPubsub`, the subclasses
p2p.gossip.service runs, and `BufferedInboundStream`, which its inbound streams are read through.

Why it matters: a gossip message reaches each peer about once from every mesh neighbour and is forwarded to each of
them, so every per-RPC cost is paid about a dozen times per message and peer, and at 1,000 peers the status
heartbeats alone are more than one message a second (swarm.bench.scale prices it). Each class says what it saves.
"""

from __future__ import annotations

import logging
import time
import weakref
from collections import OrderedDict, defaultdict
from collections.abc import Iterable
from typing import Any, Callable

from libp2p.abc import INetStream
from libp2p.io.exceptions import IOException, MessageTooLarge
from libp2p.network.connection.exceptions import RawConnError
from libp2p.network.stream.exceptions import StreamEOF, StreamError
from libp2p.peer.id import ID
from libp2p.pubsub.gossipsub import GossipSub
from libp2p.pubsub.pb import rpc_pb2
from libp2p.pubsub.pubsub import GossipsubEvent, Pubsub
from libp2p.pubsub.score import ScoreParams
from libp2p.pubsub.utils import maybe_consume_signed_record, safe_bytes_from_hex
from libp2p.pubsub.validators import signature_validator
from libp2p.utils.varint import read_varint_prefixed_bytes_limited

log = logging.getLogger(__name__)

OPPORTUNISTIC_GRAFT_TICKS = 60
"""Heartbeats between two rounds of opportunistic grafting and mesh-quality replacement (gossipsub v1.1's
OpportunisticGraftTicks, go-libp2p's default)."""
GOSSIP_EVERY_TICKS = 3
"""Heartbeats between two rounds of IHAVE gossip, and the gossip window (heartbeats of messages each round
advertises): every message is advertised in exactly one round, up to this many heartbeats after it arrived."""
IDONTWANT_MIN_BYTES = 1024
IWANT_RETRANSMISSIONS = 3
"""Times one peer is sent one message it asks for by IWANT (go-libp2p's GossipRetransmission)."""
IWANT_MEMORY = 65536
"""(peer, message) pairs whose IWANT answers are counted, the least recently asked forgotten first."""
"""Smallest message worth an IDONTWANT (go-libp2p's IDontWantMessageThreshold): below it the control RPC costs as
much as the duplicate it would save."""


class LeanGossipSub(GossipSub):
    """py-libp2p 0.8.1's GossipSub minus most of its CPU per gossip message (with LeanPubsub: less than half).

    Why: every RPC costs about 2.5 ms of CPU in py-libp2p, and all hosts of a process share one trio thread. With
    6 fully meshed hosts each publishing one small heartbeat a second, py-libp2p spends about 140 ms of CPU per
    publish (55 RPCs: 25 forwards and 30 IDONTWANTs, each carrying a signed peer record that the receiver verifies
    twice). Past the CPU the process gets, inbound bytes pile up in the sockets and a new stream's SYN and
    protocol negotiation wait behind that backlog: opening any stream takes 8-10 s, then times out.
    IDONTWANT is sent for every message received, whatever its size: only for messages of IDONTWANT_MIN_BYTES
    and more here, as go-libp2p does (large rollout messages keep the saving).
    Opportunistic grafting and mesh-quality replacement (score the mesh, swap its worst peer for a better one) run
    at every heartbeat, for every topic: here every OPPORTUNISTIC_GRAFT_TICKS heartbeats, as gossipsub v1.1 and
    go-libp2p schedule them. Every second they would score each mesh and topic peer of six topics, about half of what
    py-libp2p's heartbeat costs an idle peer of 32, and each swap is a PRUNE and a GRAFT.
    IHAVE gossip goes out every GOSSIP_EVERY_TICKS heartbeats over a window of as many heartbeats (the router
    sets its window itself), not every heartbeat over the last three: each message is still advertised
    to D_lazy peers outside the mesh per topic, once instead of three times. Why: between versions the status
    heartbeats keep every gossip window non-empty, so a peer with more neighbours than its mesh would send and receive
    about six IHAVE RPCs a second, most of the RPCs an idle peer of 64 handles (counted per RPC type), each
    costing as much as a forward.
    The peer scorer's decay step runs only when some decay is below 1. Why: py-libp2p multiplies every counter of
    every peer and topic by its decay at each heartbeat, and its default parameters (ours: p2p.scores scores peers
    instead) make every decay 1, so the step changes nothing and takes about a twentieth of an idle peer's CPU.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs["gossip_window"] = GOSSIP_EVERY_TICKS  # a gossip round advertises everything since the one before
        kwargs.setdefault("gossip_history", GOSSIP_EVERY_TICKS + 2)  # and can still serve the IWANTs it draws
        super().__init__(*args, **kwargs)
        self.heartbeats = 0
        self._iwant_served: OrderedDict[tuple[ID, bytes], int] = OrderedDict()
        if self.scorer is not None and not decays_anything(self.scorer.params):
            self.scorer.on_heartbeat = _nothing_decays  # type: ignore[method-assign]

    def mesh_heartbeat(self) -> tuple[defaultdict[ID, list[str]], defaultdict[ID, list[str]]]:
        self.heartbeats += 1
        return super().mesh_heartbeat()

    def gossip_heartbeat(self) -> defaultdict[ID, dict[str, list[bytes]]]:
        if self.heartbeats % GOSSIP_EVERY_TICKS:
            return defaultdict(dict)
        return super().gossip_heartbeat()

    def _perform_opportunistic_grafting(self, topic: str, peers_to_graft: defaultdict[ID, list[str]]) -> int:
        if self.heartbeats % OPPORTUNISTIC_GRAFT_TICKS:
            return 0
        return super()._perform_opportunistic_grafting(topic, peers_to_graft)

    async def _maintain_mesh_quality(self, topic: str) -> None:
        if self.heartbeats % OPPORTUNISTIC_GRAFT_TICKS == 0:
            await super()._maintain_mesh_quality(topic)

    async def handle_iwant(self, iwant_msg: rpc_pb2.ControlIWant, sender_peer_id: ID) -> None:
        """py-libp2p's answer, for each cached message the request names (once, however often it repeats the id)
        that the peer was sent fewer than IWANT_RETRANSMISSIONS times by IWANT. Why: py-libp2p copies a message into
        its answer once per time its id is named, so one IWANT of 1 MiB naming a 900 KiB rollout ten thousand
        times built gigabytes in memory, and a peer could ask for the same messages again ten times a second."""
        wanted = []
        for wire_id in dict.fromkeys(iwant_msg.messageIDs):
            mid = safe_bytes_from_hex(wire_id)
            if mid is None or self.mcache.get(mid) is None:
                continue
            key = (sender_peer_id, mid)
            served = self._iwant_served.pop(key, 0)
            self._iwant_served[key] = served + 1
            if served < IWANT_RETRANSMISSIONS:
                wanted.append(wire_id)
        while len(self._iwant_served) > IWANT_MEMORY:
            self._iwant_served.popitem(last=False)
        if wanted:
            await super().handle_iwant(rpc_pb2.ControlIWant(messageIDs=wanted), sender_peer_id)

    async def handle_prune(self, prune_msg: rpc_pb2.ControlPrune, sender_peer_id: ID) -> None:
        """py-libp2p's, for topics we are in only. Why: it keeps a back-off entry (and a flood-tracking one) for
        every topic a PRUNE names, until that topic is grafted again, also after its sender left, so PRUNEs naming
        made-up topics grew memory without end; a PRUNE for a topic we are not in has nothing to take us out of."""
        if prune_msg.topicID in self.mesh:
            await super().handle_prune(prune_msg, sender_peer_id)

    async def _do_px(self, px_peers: list[rpc_pb2.PeerInfo]) -> None:
        """Nothing: the peers a PRUNE names are neither checked nor dialed. Why: py-libp2p takes peer exchange from
        any peer (its score gate lets every score through), checking a signed record and dialing the addresses in
        it for each of up to 16 peers per PRUNE, ids and addresses of the sender's choosing: a crowd would choose
        our connections, or aim our dials at any host. Our peers never send it (do_px is off); they meet through
        the DHT and bootstrap peers."""

    async def _emit_idontwant_for_message(self, msg_id: bytes, topic_ids: Iterable[str]) -> None:
        message = self.mcache.get(msg_id)  # put there just before, under the same (from, seqno) id
        if message is not None and len(message.data) < IDONTWANT_MIN_BYTES:
            return
        await super()._emit_idontwant_for_message(msg_id, topic_ids)


def decays_anything(params: ScoreParams) -> bool:
    """Whether a heartbeat's decay step of py-libp2p's peer scorer would change any counter under `params`."""
    per_topic = (params.p1_time_in_mesh, params.p2_first_message_deliveries, params.p3_mesh_message_deliveries,
                 params.p4_invalid_messages)
    decays = [topic.decay for topic in per_topic] + [params.p5_behavior_penalty_decay, params.p6_appl_slack_decay]
    return any(decay != 1.0 for decay in decays)


def _nothing_decays(dt_seconds: float = 1.0) -> None:
    """The scorer's decay step when every decay is 1."""


class LeanPubsub(Pubsub):
    """py-libp2p's Pubsub that sends its signed peer record once per stream and handles each received message in
    the task that read it.

    - The record goes in the first RPC of each stream (the subscription hello), which keeps the peer's certified
      address book fed, instead of in every RPC, where the receiver verifies it twice (LeanGossipSub says what
      that cost).
    - py-libp2p starts a service task per received message (`manager.run_task(push_msg)`): a task object, a
      generated name, a cancel scope and two scheduler passes, about a tenth of what a peer spends per message
      while heartbeats flow. Everything `push_msg` awaits is bounded (sync validators, enqueueing forwards), as
      is the control handling py-libp2p already runs in line, so the stream's own reader runs it: messages from
      one peer are handled one after the other, which also holds back a peer that sends faster than we handle,
      and an error its message causes ends its stream (and costs it, through p2p.host.p2p_host's handler guard) instead
      of surfacing in the service.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._record_sent: weakref.WeakSet[INetStream] = weakref.WeakSet()
        self.on_forged: Callable[[ID], None] | None = None
        """Called with the peer that handed over a message whose pubsub signature does not verify."""

    async def push_msg(self, msg_forwarder: ID, msg: rpc_pb2.Message) -> None:
        """py-libp2p's, with a received message whose signature does not verify reported to `on_forged`.

        Why: py-libp2p drops such a message without a word, before any of our checks, so a peer could send
        forgeries without end, each costing a signature check, and never be scored. An honest peer checks every
        signature before it forwards a message, so a forged one is the forwarder's own. The signature is checked
        once: py-libp2p reads `strict_signing` before its first await (`validate_msg`), which sets it back."""
        if (msg_forwarder == self.my_id or not self.strict_signing or self.is_peer_blacklisted(msg_forwarder)
                or self.is_peer_blacklisted(ID(msg.from_id)) or self._is_msg_seen(msg)):
            await super().push_msg(msg_forwarder, msg)
            return
        if not signature_validator(msg):
            if self.on_forged is not None:
                self.on_forged(msg_forwarder)
            return
        self.strict_signing = False
        try:
            await super().push_msg(msg_forwarder, msg)
        finally:
            self.strict_signing = True

    async def validate_msg(self, msg_forwarder: ID, msg: rpc_pb2.Message) -> None:
        self.strict_signing = True  # our own publishes, from other tasks, are signed again (see push_msg)
        await super().validate_msg(msg_forwarder, msg)

    async def write_msg(self, stream: INetStream, rpc_msg: rpc_pb2.RPC) -> bool:
        if rpc_msg.HasField("senderRecord"):
            if stream in self._record_sent:
                slim = rpc_pb2.RPC()
                slim.CopyFrom(rpc_msg)  # the same RPC object goes to other peers: never edit it in place
                slim.ClearField("senderRecord")
                rpc_msg = slim
            else:
                self._record_sent.add(stream)
        return await super().write_msg(stream, rpc_msg)

    def _next_seqno(self) -> bytes:
        self.counter = next_seqno(self.counter, time.time())
        return self.counter.to_bytes(8, "big")

    def add_to_blacklist(self, peer_id: ID) -> None:
        """Blacklist `peer_id` and tear its pubsub state down; safe to call again, and while the service stops."""
        self.blacklisted_peers.add(peer_id)
        if self.manager.is_running:
            self.manager.run_task(self._teardown_if_connected, peer_id)

    async def _teardown_if_connected(self, peer_id: ID) -> None:
        """Forget a blacklisted peer as a dead one is forgotten, before the first await, then reset its stream.

        Why not py-libp2p's: it awaits the stream's reset and then deletes the peer, and a hang-up on the same
        peer (a ban closes the connection too) removes it during that await, so the delete raised KeyError, which
        ended the pubsub service and the node. It also left the peer's outbound queue open (its sending task
        waiting forever) and its router state behind: one of each per banned identity."""
        stream = self.peers.pop(peer_id, None)
        queue = self.peer_queues.pop(peer_id, None)
        if queue is not None:
            queue.close()
        self.router.remove_peer(peer_id)
        self._forget_all_subscriptions(peer_id)
        if stream is not None:
            try:
                await stream.reset()
            except Exception:  # noqa: BLE001 - the stream of a peer being banned may be broken already
                log.debug("resetting the pubsub stream of blacklisted %s failed", peer_id, exc_info=True)

    async def _handle_new_peer(self, peer_id: ID) -> None:
        """py-libp2p's, plus a teardown when the peer was blacklisted while its stream opened (py-libp2p reads the
        blacklist before that await and registers the peer after it)."""
        await super()._handle_new_peer(peer_id)
        if peer_id in self.peers and self.is_peer_blacklisted(peer_id):
            await self._teardown_if_connected(peer_id)

    async def continuously_read_stream(self, stream: INetStream) -> None:
        """py-libp2p's reader, with the peer's signed record checked in the first RPC of the stream that carries
        one and ignored in any later one. Why: checking a record is a signature check (about 70 us for a 216-byte
        RPC), a peer may attach its own valid record to every RPC at no cost to itself, and our peers send it
        once per stream (see the class docstring)."""
        peer_id = stream.muxed_conn.peer_id
        record_read = False
        try:
            while self.manager.is_running:
                data = await read_varint_prefixed_bytes_limited(stream, self.max_inbound_rpc_size)
                rpc = rpc_pb2.RPC()
                rpc.ParseFromString(data)
                if rpc.HasField("senderRecord") and record_read:
                    rpc.ClearField("senderRecord")
                record_read = record_read or rpc.HasField("senderRecord")
                if not maybe_consume_signed_record(rpc, self.host, peer_id):
                    log.debug("pubsub RPC from %s carried an invalid signed record; ignored", peer_id)
                    continue
                await self._handle_rpc(peer_id, rpc)
                if stream.metric_send_channel is not None:
                    await stream.metric_send_channel.send(_metrics_event(peer_id, len(data), rpc))
        except MessageTooLarge as exc:
            log.warning("pubsub RPC from %s over the size limit: %s", peer_id, exc)
            try:
                await stream.reset()
            except Exception:  # noqa: BLE001 - resetting a stream that broke is best effort
                pass
            self._handle_dead_peer(peer_id)
        except (StreamEOF, StreamError, IOException, RawConnError) as exc:
            log.debug("pubsub stream from %s ended: %s", peer_id, exc)

    async def _handle_rpc(self, peer_id: ID, rpc: rpc_pb2.RPC) -> None:
        for msg in rpc.publish:
            if self._is_subscribed_to_msg(msg) and self.manager.is_running:
                await self.push_msg(peer_id, msg)
        if rpc.subscriptions:
            if len(rpc.subscriptions) > self.max_subscriptions_per_rpc:
                log.warning("%s sent %d subscriptions in one RPC (at most %d); ignored", peer_id,
                            len(rpc.subscriptions), self.max_subscriptions_per_rpc)
            else:
                for subscription in rpc.subscriptions:
                    self.handle_subscription(peer_id, subscription)
        if rpc.HasField("control"):
            await self.router.handle_rpc(rpc, peer_id)


def _metrics_event(peer_id: ID, size: int, rpc: rpc_pb2.RPC) -> GossipsubEvent:
    """The per-RPC event py-libp2p's metrics read, built only when a metrics channel listens."""
    event = GossipsubEvent()
    event.peer_id = peer_id.pretty()
    event.message_size = size
    event.publish = bool(rpc.publish)
    event.subopts = bool(rpc.subscriptions)
    event.control = rpc.HasField("control")
    return event


class BufferedInboundStream:
    """An inbound pubsub stream read in large chunks; every other attribute is the wrapped stream's.

    Why: py-libp2p reads a gossip RPC one byte per varint byte and then its body, and every read of a Yamux stream
    takes the connection's stream lock and re-checks the receive window (sometimes sending a window update). In
    `swarm sim`, whose hosts share one trio thread, those reads and window checks are about a fifth of that
    thread's time. Here one Yamux read takes everything buffered (up to `chunk` bytes) and the varint and body are
    served from it. Only reads are buffered; reset, close and the connection pass through unchanged.
    """

    def __init__(self, stream: INetStream, chunk: int = 64 * 1024) -> None:
        self._stream = stream
        self._chunk = chunk
        self._buffer = bytearray()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)

    async def read(self, n: int | None = -1) -> bytes:
        if n is None or n < 0:  # "everything until EOF": hand over what is buffered first, then pass through
            if self._buffer:
                data, self._buffer = bytes(self._buffer), bytearray()
                return data
            return await self._stream.read(n)
        if not self._buffer:
            data = await self._stream.read(max(n, self._chunk))
            if len(data) <= n:  # no copy into the buffer when the read is consumed whole (and b"" at EOF)
                return data
            self._buffer += data
        data = bytes(self._buffer[:n])
        del self._buffer[:n]
        return data


def next_seqno(previous: int, now: float) -> int:
    """The next pubsub sequence number: past the previous one and never below the wall clock in microseconds.

    Why: py-libp2p starts its counter at the clock in whole seconds and adds one per message, so a peer that sent
    more messages than seconds passed and restarted under the same key would reuse its earlier (from, seqno) ids,
    which every receiver's seen-cache drops as duplicates: an inference peer restarted after 34 s and 60 messages
    would go unheard for over a minute, its rollouts lost. In microseconds a restart always starts past them.
    """
    return max(previous + 1, int(now * 1e6))
