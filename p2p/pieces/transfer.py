"""The thin trio adapter that drives a SwarmEngine over many links: bytes in and out, nothing decided here.

Each link is an already-authenticated byte stream tagged with its peer id (libp2p from p2p/host, or memnet). Per
link: a hello exchange (manifest id + have-map), one receiver loop that decodes frames and feeds the engine, and one
sender task that drains the link's outbox. Rules kept here:

- every received piece is hashed (BLAKE3) against the manifest BEFORE the engine hears of it, so nothing
  unverified is ever stored or announced;
- pieces are read from the store with one pread when they are about to be sent (never whole files in memory);
- one frame must leave within `send_timeout` and the hello must arrive within `handshake_timeout`; a peer that
  breaks the framing, vanishes mid-piece, or misbehaves is dropped, never crashing the service;
- new links may arrive at any time, and the service keeps seeding after completion until it is cancelled.
"""

from __future__ import annotations

import itertools
import logging
import math
import random
from dataclasses import dataclass
from typing import Callable

import blake3
import trio

from p2p.budget import NODE_BUDGET, BudgetLease, MemoryBudget
from p2p.pieces.engine import BUSY, Completed, DropPeer, Send, SendPiece, StorePiece, SwarmEngine
from p2p.errors import ChannelError, CorruptPieceError, FrameError, StoreError
from p2p.pieces.link_errors import first_leaf, is_breach, link_failure
from p2p.pieces.manifest import PolicyManifest
from p2p.pieces.outbox import Outbox
from p2p.ratelimit import TokenBucket, acquire_all
from p2p.pieces.store import PieceStore
from p2p.pieces.transfer_config import TransferConfig
from p2p.pieces.transfer_stats import LinkActivity, PeerStats, Progress
from p2p.pieces.wire import (
    Bitfield, Cancel, FrameDecoder, Have, Hello, Message, Piece, Reject, Request, Stream, message_frame,
    pack_bits, parse_message, read_frame, send_buffers, unpack_bits,
)

log = logging.getLogger(__name__)
MAX_OUTBOX = 4096  # messages queued to one peer; more means it stopped reading (or floods us with requests)
# what a dying or hostile link may raise (ChannelError: p2p/channel*.py and p2p/libp2p_compat.py streams)
FRAMES_PER_CHECKPOINT = 32
_LINK_ERRORS = (FrameError, ChannelError, trio.BrokenResourceError, trio.ClosedResourceError, trio.TooSlowError)


@dataclass(frozen=True)
class _Opened:
    """A link whose first frame (the peer's hello) was already read by a SwarmRouter."""

    decoder: FrameDecoder
    hello: tuple[dict, bytearray]


@dataclass
class _Link:
    peer: str
    stream: Stream
    outbox: Outbox
    bucket: TokenBucket
    lease: BudgetLease
    scope: trio.CancelScope | None = None
    greeted: bool = False  # the handshake completed: the peer took part in the protocol
    opened_at: float = 0.0
    active_at: float = 0.0  # last piece moved either way or request received (LinkActivity)


class SwarmService:
    """Runs the piece protocol for one manifest over every link handed to `add_link`."""

    def __init__(self, manifest: PolicyManifest, store: PieceStore, *, config: TransferConfig = TransferConfig(),
                 on_progress: Callable[[Progress], None] | None = None,
                 on_drop: Callable[[str, str, bool], None] | None = None,
                 rng: random.Random | None = None, upload_bucket: TokenBucket | None = None,
                 budget: MemoryBudget = NODE_BUDGET, wanted: bytes | None = None) -> None:
        store.add_manifest(manifest)
        self.manifest, self.store, self.config = manifest, store, config
        # on_drop: (peer, why, hostile) once per dropped peer: the caller may ban a hostile one
        self.on_progress, self.on_drop = on_progress, on_drop
        # wanted: the pieces to fetch (SwarmEngine's `wanted`; default all), widened later by `want`
        self.engine = SwarmEngine(manifest.num_pieces, store.bitfield(manifest), config=config.engine, rng=rng,
                                  wanted=wanted)
        self.completed, self._more_wanted = trio.Event(), trio.Event()  # every wanted piece held; `want` called
        self.stats: dict[str, PeerStats] = {}
        self.drops: dict[str, str] = {}
        self.banned: set[str] = set()  # peers that broke the protocol: a new link from or to them is closed at once
        self._reported: set[str] = set()  # linked peers whose drop was already reported (once per link)
        self.corrupt_pieces: set[int] = set()  # pieces whose stored copy went bad on disk (refused since)
        self._links: dict[str, _Link] = {}
        # set when a link opens: the ticker sleeps on it while there is none (a version kept for its window would
        # tick every second for nothing)
        self._link_opened = trio.Event()
        # the node's upload cap: one bucket shared by the services of every version the node serves; none, uncapped
        self._bucket = upload_bucket if upload_bucket is not None else TokenBucket(math.inf)
        self._nursery: trio.Nursery | None = None
        self._tick_wait: trio.CancelScope | None = None  # the ticker's sleep, while it sleeps
        self._stopped = False  # run() has returned: its nursery takes no new links
        self._max_payload = max(f.piece_size for f in manifest.files)
        self._budget = budget  # frames not yet whole (so not yet verified) hold their bytes on it

    # ------------------------------------------------------------------ service

    async def run(self, *, task_status: trio.TaskStatus[SwarmService] = trio.TASK_STATUS_IGNORED) -> None:
        """Serve until cancelled: links run in this nursery, a ticker re-issues slow requests only while a link is
        open and wanted pieces are missing (a complete version, served for most of its window, never wakes the peer).
        A store failure (disk full, I/O error) ends the service with that one user-facing error, not a group."""
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                if self.engine.complete:
                    self.completed.set()
                task_status.started(self)
                while True:
                    while not self.engine.complete:
                        if not self._links:  # nothing to time out or ask while no link is open: wait for one
                            await self._link_opened.wait()
                        self._link_opened = trio.Event()
                        await self._until_tick()
                        self._dispatch(self.engine.tick(trio.current_time()))
                    await self._more_wanted.wait()  # complete: serving answers requests and needs no ticks
                    self._more_wanted = trio.Event()
        except* StoreError as group:
            raise first_leaf(group) from None
        finally:
            self._stopped = True
            for link in self._links.values():  # links served in a caller's task (serve_link) end with the service
                if link.scope is not None:
                    link.scope.cancel()

    async def _until_tick(self) -> None:
        """Sleep `tick_interval`, or until a busy backoff ends if sooner (`_tick_at_retry`): a refused requester
        asks the busy peer again on a tick, and waiting a whole tick (1 s) after a 0.2 s backoff idled fast links."""
        with trio.move_on_after(self.config.tick_interval) as self._tick_wait:
            self._tick_at_retry()
            await trio.sleep_forever()
        self._tick_wait = None

    def _tick_at_retry(self) -> None:
        retry = self.engine.next_retry()
        if self._tick_wait is not None and retry is not None:
            self._tick_wait.deadline = min(self._tick_wait.deadline, retry)

    def add_link(self, peer: str, stream: Stream, opened: _Opened | None = None) -> bool:
        """Start serving a new authenticated link (any time, also after completion); False once the service has
        stopped (a link dialed while the node shut down): the caller then closes the stream.

        `opened` is for SwarmRouter: the decoder and the peer's hello frame it already read from `stream`.
        """
        if self._stopped:
            return False
        if self._nursery is None:
            raise RuntimeError("SwarmService.run must be started before links are added")
        self._nursery.start_soon(self._serve_link, peer, stream, opened)
        return True

    @property
    def peers(self) -> list[str]:
        return list(self._links)

    def activity(self, peer: str) -> LinkActivity | None:
        """What the open link to `peer` has carried lately; None when there is none."""
        link = self._links.get(peer)
        if link is None:
            return None
        state = self.engine.peers.get(peer)
        offers = state is not None and bool((state.bits & self.engine.wanted & ~self.engine.have).any())
        lacks = state is not None and bool((self.engine.have & ~state.bits).any())
        return LinkActivity(link.opened_at, link.active_at, state is not None, offers, lacks)

    def want(self, flags: bytes) -> None:
        """Fetch these pieces too; `completed` is a new event until they are held."""
        self._dispatch(self.engine.want(flags, trio.current_time()))
        if not self.engine.complete and self.completed.is_set():
            self.completed = trio.Event()
        self._more_wanted.set()

    def add_stored(self, indices: list[int]) -> None:  # pieces that came over no link (files rebuilt from a patch)
        self._dispatch(self.engine.pieces_added(indices, trio.current_time()))

    def reveal_lapsed(self) -> None:
        """Super-seed: announce the pieces whose promises to peers that never asked have lapsed (engine)."""
        self._dispatch(self.engine.reveal_lapsed(trio.current_time()))

    def release(self, peer: str, why: str) -> None:
        """Close the link to `peer` (not for a breach: it may link again), reported to `on_drop` like any drop."""
        link = self._links.get(peer)
        if link is not None and link.scope is not None:
            self._note_drop(peer, why, hostile=False)
            link.scope.cancel()

    def progress(self) -> Progress:  # over the pieces of the form this peer fetches (all, its full files or patch)
        wanted = self.engine.wanted_count
        return Progress(wanted - len(self.engine.missing), wanted,
                        {p: s.bytes_up for p, s in self.stats.items()},
                        {p: s.bytes_down for p, s in self.stats.items()}, dict(self.drops))

    # ------------------------------------------------------------------ one link

    async def serve_link(self, peer: str, stream: Stream) -> None:
        """Run one link in the caller's task until it ends or the service stops; never raises for a misbehaving
        peer. `add_link` does the same in the service's own nursery.

        Why the link ends with the service: a policy mirror stops a version's service when the version leaves its
        window and deletes its pieces; an inbound link left running in the acceptor's task kept answering requests
        for that version from deleted files.
        """
        if self._stopped:
            await trio.aclose_forcefully(stream)
            return
        await self._serve_link(peer, stream)

    async def _serve_link(self, peer: str, stream: Stream, opened: _Opened | None = None) -> None:
        if peer in self._links or peer in self.banned:  # one link per peer (have-maps are per peer), none if banned
            await trio.aclose_forcefully(stream)
            return
        now = trio.current_time()
        link = _Link(peer, stream, Outbox(), TokenBucket(self.config.peer_upload_bps),
                     self._budget.lease("a piece frame"), opened_at=now, active_at=now)
        self._links[peer] = link
        self._link_opened.set()
        self.stats.setdefault(peer, PeerStats())
        try:
            with trio.CancelScope() as link.scope:
                decoder = opened.decoder if opened else FrameDecoder(max_payload=self._max_payload)
                await self._handshake(link, decoder, opened.hello if opened else None)
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(self._sender, link)
                    await self._receiver(link, decoder)
                    nursery.cancel_scope.cancel()
        except* _LINK_ERRORS as group:  # the link's own nursery wraps its errors in a group
            exc = first_leaf(group)
            hostile = is_breach(exc)
            # a link the peer closed before its hello was refused (a duplicate, or a version it just dropped), routine
            self._note_drop(peer, link_failure(exc), hostile, quiet=not (hostile or link.greeted))
        except* StoreError:
            raise  # our disk failed, not the peer: the service ends with that one error (see run)
        except* Exception as group:  # anything else a link raised costs that link, never the service or the node
            exc = first_leaf(group)
            log.warning("link with %s failed unexpectedly: %s: %s", peer, type(exc).__name__, exc)
            log.debug("link failure traceback", exc_info=exc)
            self._note_drop(peer, f"its link failed unexpectedly ({type(exc).__name__})", hostile=False)
        finally:
            del self._links[peer]
            self._reported.discard(peer)
            self._dispatch(self.engine.peer_gone(peer, trio.current_time()))
            link.lease.close()
            await trio.aclose_forcefully(stream)

    async def _handshake(self, link: _Link, decoder: FrameDecoder, frame: tuple | None) -> None:
        told = self.engine.hello_flags()
        hello = Hello(self.manifest.id, pack_bits(told))
        with trio.fail_after(self.config.handshake_timeout):
            await _send_message(link.stream, hello)
            if frame is None:
                frame = await self._read_frame(link, decoder)
        if frame is None:
            raise trio.BrokenResourceError("the peer closed the link before its hello")
        msg = parse_message(*frame, num_pieces=self.manifest.num_pieces)
        if not isinstance(msg, Hello) or msg.manifest_id != self.manifest.id:
            raise FrameError("the peer's first frame is not a hello for this manifest")
        flags = unpack_bits(msg.bitfield, self.manifest.num_pieces)
        link.greeted = True
        self._dispatch(self.engine.peer_connected(link.peer, flags, trio.current_time(), told))

    async def _receiver(self, link: _Link, decoder: FrameDecoder) -> None:
        """Decode frames until the peer closes; a protocol error propagates and drops the link."""
        n = self.manifest.num_pieces
        for count in itertools.count(1):
            if count % FRAMES_PER_CHECKPOINT == 0:  # frames already buffered are read without yielding: a burst of
                await trio.lowlevel.checkpoint()  # small ones (a hostile peer's) must not hold the whole node
            frame = await self._read_frame(link, decoder)
            if frame is None:
                return
            msg = parse_message(*frame, num_pieces=n)
            now = trio.current_time()
            if isinstance(msg, Piece):
                self._on_piece(link, msg, now)
            elif isinstance(msg, Have):
                self._dispatch(self.engine.peer_have(link.peer, msg.index, now))
            elif isinstance(msg, Request):
                if self.engine.have[msg.index]:  # it takes from us; asking for what we lack costs it nothing
                    link.active_at = now
                self._dispatch(self.engine.peer_request(link.peer, msg.index, now))
            elif isinstance(msg, Cancel):
                self._dispatch(self.engine.peer_cancel(link.peer, msg.index, now))
            elif isinstance(msg, Reject):
                self._dispatch(self.engine.peer_reject(link.peer, msg.index, now, busy=msg.reason == BUSY))
                self._tick_at_retry()
            elif isinstance(msg, Bitfield):
                self._dispatch(self.engine.peer_bitfield(link.peer, unpack_bits(msg.bits, n), now))
            else:
                raise FrameError("a second hello on the same link")

    async def _read_frame(self, link: _Link, decoder: FrameDecoder) -> tuple | None:
        """The link's next frame; what the decoder keeps of a frame not yet whole stays charged to the budget."""
        frame = await read_frame(_ChargedReader(link.stream, decoder, link.lease), decoder, self.config.receive_chunk)
        link.lease.resize(decoder.buffered)
        return frame

    def _on_piece(self, link: _Link, msg: Piece, now: float) -> None:
        ref = self.manifest.pieces[msg.index]
        ok = len(msg.data) == ref.length and blake3.blake3(msg.data).digest() == ref.hash
        peer = link.peer
        if ok:
            link.active_at = now
        stats = self.stats[peer]
        stats.bytes_down += len(msg.data)
        stats.pieces_down += 1
        stats.pieces_corrupt += not ok
        self._dispatch(self.engine.piece_received(peer, msg.index, ok, now), piece=msg)

    async def _sender(self, link: _Link) -> None:
        """Drain the link's outbox, control messages first and together (p2p/pieces/outbox.py); pieces are read from the
        store just before they are sent."""
        while True:
            control, piece = await link.outbox.take()
            if control:
                with trio.fail_after(self.config.send_timeout):
                    await send_buffers(link.stream, _control_frames(control))
            if piece is not None:
                await self._send_piece(link, piece.index)

    async def _send_piece(self, link: _Link, index: int) -> None:
        try:
            data = self.store.read_piece(self.manifest, index)
        except CorruptPieceError as exc:  # our copy went bad on disk: the peer fetches the piece elsewhere
            if index not in self.corrupt_pieces:
                self.corrupt_pieces.add(index)
                log.warning("%s", exc)
            self._dispatch(self.engine.upload_done(link.peer, index, trio.current_time(), delivered=False))
            with trio.fail_after(self.config.send_timeout):
                await _send_message(link.stream, Reject(index, "corrupt on disk"))
            return
        await acquire_all([self._bucket, link.bucket], len(data))
        late = link.outbox.take_control()  # came while the piece was readied: they would wait for it anyway
        with trio.fail_after(self.config.send_timeout):
            await send_buffers(link.stream, _control_frames(late) + message_frame(Piece(index, data)))
        link.active_at = trio.current_time()
        stats = self.stats[link.peer]
        stats.bytes_up += len(data)
        stats.pieces_up += 1
        self._dispatch(self.engine.upload_done(link.peer, index, trio.current_time()))
        self._report()

    # ------------------------------------------------------------------ actions

    def _dispatch(self, actions: list, piece: Piece | None = None) -> None:
        """Carry out the engine's actions in order (synchronously: the engine's state is never stale)."""
        for act in actions:
            if isinstance(act, (Send, SendPiece)):
                link = self._links.get(act.peer)
                if link is None:
                    continue
                if len(link.outbox) >= MAX_OUTBOX:
                    self._dispatch(self.engine.peer_gone(act.peer, trio.current_time()))
                    self._dispatch([DropPeer(act.peer, "does not read what we send", hostile=False)])
                    continue
                if isinstance(act, Send):
                    link.outbox.put_control(act.message)
                else:
                    link.outbox.put_piece(act)
            elif isinstance(act, StorePiece):
                assert piece is not None and piece.index == act.index
                self.store.write_piece(self.manifest, act.index, piece.data, verify=False)  # hashed in _on_piece
                self._report()
            elif isinstance(act, DropPeer):
                self._note_drop(act.peer, act.reason, act.hostile)
                link = self._links.get(act.peer)
                if link is not None and link.scope is not None:
                    link.scope.cancel()
            elif isinstance(act, Completed):
                self.completed.set()
                self._report()

    def _note_drop(self, peer: str, why: str, hostile: bool, quiet: bool = False) -> None:
        """Record why `peer` was dropped, once per link (the link's own end follows every drop), and tell `on_drop`
        unless `quiet`; a hostile peer is banned from this service, or it would be linked again and cost a piece
        each time."""
        if peer in self._reported:
            return
        self._reported.add(peer)
        self.drops[peer] = why
        if hostile:
            self.banned.add(peer)
        if self.on_drop is not None and not quiet:
            self.on_drop(peer, why, hostile)

    def _report(self) -> None:
        if self.on_progress is not None:
            self.on_progress(self.progress())


class _ChargedReader:
    """A link's receiving side as `read_frame` sees it: what a read adds to the decoder is charged to the node's
    budget of unverified input before the decoder keeps it (BudgetExhausted, a ChannelError, drops the link)."""

    def __init__(self, stream: Stream, decoder: FrameDecoder, lease: BudgetLease) -> None:
        self._stream, self._decoder, self._lease = stream, decoder, lease

    async def receive_some(self, max_bytes: int | None = None) -> bytes | bytearray:
        data = await self._stream.receive_some(max_bytes)
        self._lease.resize(self._decoder.buffered + len(data))
        return data


def _control_frames(messages: list) -> list[bytes]:
    """Control messages as one buffer (none for none): they share one record of the data channel."""
    return [b"".join(b for msg in messages for b in message_frame(msg))] if messages else []


async def _send_message(stream: Stream, msg: Message) -> None:
    await send_buffers(stream, message_frame(msg))


async def run_swarm(manifest: PolicyManifest, store: PieceStore, links: trio.MemoryReceiveChannel, *,
                    role: str = "peer", upload_bucket: TokenBucket | None = None,
                    config: TransferConfig | None = None,
                    on_progress: Callable[[Progress], None] | None = None, rng: random.Random | None = None,
                    task_status: trio.TaskStatus[SwarmService] = trio.TASK_STATUS_IGNORED) -> None:
    """Serve `manifest` over every (peer_id, stream) that arrives on `links`, until cancelled.

    `role` picks a TransferConfig (see `TransferConfig.for_role`) unless `config` is given. `upload_bucket` is the
    node's upload cap, shared with every other manifest the node serves (as the policy mirror shares its own); none
    leaves the upload uncapped. The started value is the SwarmService (its `completed` event, `progress()`,
    `add_link`).
    """
    config = config or TransferConfig.for_role(role)
    service = SwarmService(manifest, store, config=config, on_progress=on_progress, rng=rng,
                           upload_bucket=upload_bucket)
    async with trio.open_nursery() as nursery:
        await nursery.start(service.run)
        task_status.started(service)
        async with links:
            async for peer, stream in links:
                if not service.add_link(peer, stream):
                    await trio.aclose_forcefully(stream)
