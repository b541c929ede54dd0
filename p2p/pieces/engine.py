"""The sans-IO swarm engine for ONE manifest: events in, actions out, no sockets and no clock.

Every method takes an event (with `now` passed in, never read) and returns a list of actions for the IO adapter
(p2p/pieces/transfer.py) to carry out in order. The same engine runs over libp2p streams, over memnet, and in the pure
simulations of the tests.

Policy, following the torrent practice for a cooperative flash crowd (docs/reference.md#torrent-mechanics):
- Picking: a few random pieces, then rarest-first (p2p/pieces/picker.py), with `pipeline_depth` requests in flight per
  peer so a link never idles for a round trip.
- Endgame: once every missing piece is already requested, the same pieces are also asked of other holders; the
  first copy to arrive wins and the others are cancelled.
- Re-announce: a piece is announced (`have`) the moment it is verified and stored, so neighbours fetch from us at once.
- Uploads: a fixed number of slots shared round-robin, always unchoked (every peer of a run is cooperative), but
  earned (p2p/pieces/upload_ledger.py): a peer asking again for a piece it received on its link, or taking more than a
  few copies of the version without serving any back, is dropped. A super-seed never refuses as BUSY.
- Busy refusals: a loaded uploader (all slots busy, `upload_backlog` queued) answers Reject(BUSY): every neighbour
  asks a new piece's first holder at once, and a request queued there pins the piece while holders that got it
  since sit idle. Refused, the requester asks the other holders and leaves the busy peer alone for `busy_backoff`
  (the adapter wakes the engine when that ends: `next_retry`). BUSY says nothing about holding the piece; refusing
  all we need counts as owing pieces (stall rule below). Only a slow uploader refuses: a queue that drains within
  `busy_backoff` at the measured upload time costs the requester less than a refusal (p2p/pieces/upload_timer.py).
- Super-seeding (an origin seed whose upload is the bottleneck): the seed advertises nothing and reveals pieces
  one by one, always a piece sent the fewest times so far, so it does not send any piece twice while another has
  never been sent; the peers spread each piece among themselves.
- Hostile peers: a corrupt or unsolicited piece drops its sender, and so does a flood of requests (counted before
  duplicates are folded, refused ones per backoff); a request outstanding longer than `request_timeout` is
  cancelled and re-issued elsewhere; a peer that owes pieces and sends nothing for `stall_timeout` is dropped.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

import numpy as np

from p2p.pieces.engine_actions import Action, Completed, DropPeer, Send, SendPiece, StorePiece
from p2p.pieces.engine_config import EngineConfig
from p2p.pieces.peer_state import PeerState
from p2p.pieces.picker import Picker, RarestFirstPicker
from p2p.pieces.super_seed import reveal, reveal_all
from p2p.pieces.upload_ledger import UploadLedger
from p2p.pieces.upload_timer import UploadTimer
from p2p.pieces.wire import Bitfield, Cancel, Have, Reject, Request, pack_bits

BULK_HAVES = 64
"""More pieces than this, stored at once outside the protocol, are announced with one have-map per peer."""
BUSY = "busy"  # the reason of a Reject that means "loaded: ask another holder for now", not "I lack the piece"

__all__ = ["BUSY", "Action", "Completed", "DropPeer", "EngineConfig", "PeerState", "Send", "SendPiece", "StorePiece",
           "SwarmEngine", "as_flags"]

# ---------------------------------------------------------------------------------------------- engine


def as_flags(flags: bytes | bytearray | memoryview | Sequence[int] | np.ndarray) -> np.ndarray:
    """0/1 flags (bytes, bytearray, list or array) as a bool array."""
    if isinstance(flags, (bytes, bytearray, memoryview)):
        return np.frombuffer(bytes(flags), dtype=np.uint8) != 0
    return np.asarray(flags).astype(bool)


class SwarmEngine:
    """Swarm decisions for one manifest of `num_pieces` pieces.

    Per-piece state lives in numpy arrays (have, pending, availability, rank) so a pick is a few vector operations
    over all pieces instead of a Python loop: about 60,000 pieces (a 62 GB policy at 1 MiB) stay cheap.
    """

    def __init__(self, num_pieces: int, have: bytes | bytearray, *, config: EngineConfig = EngineConfig(),
                 rng: random.Random | None = None, picker: Picker | None = None,
                 wanted: bytes | bytearray | None = None) -> None:
        """wanted: 0/1 per piece, the pieces to fetch (default all). A version that is also a patch over its parent
        is fetched in one of two forms, its full files or its patch (swarm.policy.patch_form): the rest of its pieces
        are neither asked for nor waited on, and may still be served once held."""
        if len(have) != num_pieces or (wanted is not None and len(wanted) != num_pieces):
            raise ValueError("have-flags and wanted-flags must hold one entry per piece")
        self.config = config
        self.num_pieces = num_pieces
        self.rng = rng or random.Random()  # per-node randomness: identical ranks would make every peer pick alike
        self.picker = picker or RarestFirstPicker(config.random_first)
        self.have = as_flags(have).copy()
        self.held = int(self.have.sum())
        self.wanted = np.ones(num_pieces, dtype=bool) if wanted is None else as_flags(wanted).copy()
        self.wanted_count = int(self.wanted.sum())
        self.missing: set[int] = set(np.flatnonzero(self.wanted & ~self.have).tolist())
        self.pending: dict[int, set[str]] = {}  # piece -> peers asked for it
        self.pending_mask = np.zeros(num_pieces, dtype=bool)  # the keys of `pending`, as flags
        self.availability = np.zeros(num_pieces, dtype=np.int64)  # connected peers holding each piece
        order = list(range(num_pieces))
        self.rng.shuffle(order)
        self.rank = np.array(order, dtype=np.int64)  # random tie-break between equally rare pieces
        self.peers: dict[str, PeerState] = {}
        self.sent_count = np.zeros(num_pieces, dtype=np.int64)  # uploads started per piece (super-seed, stats)
        self.super_seeding = config.super_seed and not self.missing
        self.ledger = UploadLedger(num_pieces, config.upload_factor, config.earn_per_piece)
        self._uploads_active = 0
        self.upload_timer = UploadTimer()
        self._rr = 0
        self._busy_until: dict[str, float] = {}  # peer -> we ask it nothing before this (it refused us as BUSY)
        self._refusing: set[str] = set()  # peers refusing us as BUSY since their last piece: the stall clock runs

    # ------------------------------------------------------------------ queries

    @property
    def complete(self) -> bool:
        return not self.missing

    def want(self, flags: bytes | bytearray, now: float) -> list[Action]:
        """Fetch these pieces too (a patch that cannot be applied: the version's full files instead)."""
        more = as_flags(flags) & ~self.wanted
        self.wanted |= more
        self.wanted_count += int(more.sum())
        self.missing.update(np.flatnonzero(more & ~self.have).tolist())
        return self._fill_all(now)

    def pieces_added(self, indices: list[int], now: float) -> list[Action]:
        """Pieces stored without the protocol (files rebuilt from a patch, verified by the store): stop asking for
        them and announce them, as one have-map per peer when they are many (a have each would queue thousands of
        messages on every link at once)."""
        fresh = [i for i in dict.fromkeys(indices) if not self.have[i]]
        if len(fresh) <= BULK_HAVES:
            return [a for index in fresh for a in self._accept(index, now, fill=False)] + self._fill_all(now)
        for index in fresh:
            self._accept(index, now, fill=False, announce=False)
        flags = self.have.astype(np.uint8).tobytes()
        return [Send(peer, Bitfield(pack_bits(flags))) for peer in self.peers] + self._fill_all(now)

    def hello_flags(self) -> bytearray:
        """Our have-flags for the handshake: empty while super-seeding (pieces are revealed one by one)."""
        return bytearray(self.num_pieces) if self.super_seeding else bytearray(self.have.astype(np.uint8).tobytes())

    # ------------------------------------------------------------------ peer lifecycle

    def peer_connected(self, peer: str, flags: bytes | bytearray, now: float,
                       told: bytes | bytearray | None = None) -> list[Action]:
        """Start trading with `peer`, which holds `flags`. `told`: the have-flags our hello to it carried; pieces
        stored since are announced now. Why: a piece stored while the two hellos crossed was announced only to the
        peers connected then, so this peer never heard of it, and a peer whose last missing piece that was waited
        for ever (a 2-peer broadcast stuck at 8 of 9 pieces on a loaded machine)."""
        if peer in self.peers:
            raise ValueError(f"peer {peer} is already connected (the adapter keeps one link per peer)")
        empty = np.zeros(self.num_pieces, dtype=bool)
        self.peers[peer] = PeerState(empty, empty.copy(), last_piece_at=now, linked_at=now)
        out = self.peer_bitfield(peer, flags, now)
        if told is not None and not self.super_seeding:
            since = self.have & ~as_flags(told) & ~self.peers[peer].bits
            out += [Send(peer, Have(int(index))) for index in np.flatnonzero(since)]
        return out + reveal(self, peer, now)

    def peer_bitfield(self, peer: str, flags: bytes | bytearray, now: float) -> list[Action]:
        state = self.peers.get(peer)
        if state is None:
            return []
        new = as_flags(flags)
        self.availability += new.astype(np.int64) - state.bits
        state.bits = new.copy()
        state.held = int(new.sum())
        return self._fill(peer, now)

    def peer_gone(self, peer: str, now: float) -> list[Action]:
        if peer not in self.peers:
            return []
        return self._forget(peer, now)

    def _forget(self, peer: str, now: float) -> list[Action]:
        state = self.peers.pop(peer)
        self._busy_until.pop(peer, None)
        self._refusing.discard(peer)
        self.availability -= state.bits
        for i in state.requested:
            self._unpend(i, peer)
        self._uploads_active -= len(state.sending)
        self.upload_timer.forget(peer, state.sending)
        return self._fill_all(now) + self._schedule_uploads(now) + reveal_all(self, now)

    def _drop(self, peer: str, reason: str, now: float, hostile: bool = True) -> list[Action]:
        return [DropPeer(peer, reason, hostile)] + self._forget(peer, now)

    def _unpend(self, index: int, peer: str) -> None:
        asked = self.pending.get(index)
        if asked is not None:
            asked.discard(peer)
            if not asked:
                del self.pending[index]
                self.pending_mask[index] = False

    # ------------------------------------------------------------------ downloading

    def peer_have(self, peer: str, index: int, now: float) -> list[Action]:
        state = self.peers.get(peer)
        if state is None or state.bits[index]:
            return []
        state.bits[index] = True
        state.held += 1
        self.availability[index] += 1
        out = self._fill(peer, now) if not self.have[index] else []
        if index in state.revealed:
            out += reveal(self, peer, now)
        return out

    def peer_reject(self, peer: str, index: int, now: float, busy: bool = False) -> list[Action]:
        """The peer will not serve `index`: ask elsewhere. Unless it is only `busy`, stop believing it holds the
        piece; when busy, it keeps the piece and is asked nothing for `busy_backoff`."""
        state = self.peers.get(peer)
        if state is None or index not in state.requested:
            return []
        del state.requested[index]
        self._unpend(index, peer)
        if busy:
            self._busy_until[peer] = now + self.config.busy_backoff
            self._refusing.add(peer)
        elif state.bits[index]:
            state.bits[index] = False
            state.held -= 1
            self.availability[index] -= 1
        return self._fill_all(now)

    def piece_received(self, peer: str, index: int, ok: bool, now: float) -> list[Action]:
        """A piece arrived from `peer`; `ok` says whether its BLAKE3 matched the manifest."""
        state = self.peers.get(peer)
        if state is None:
            return []
        if index not in state.requested and index not in state.cancelled:
            return self._drop(peer, f"sent piece {index} that was not requested", now)
        state.requested.pop(index, None)
        state.cancelled.discard(index)
        self._unpend(index, peer)
        if not ok:
            return self._drop(peer, f"sent a corrupt piece {index}", now)
        state.last_piece_at = now
        self._refusing.discard(peer)
        self.ledger.note_received(peer)
        if self.have[index]:
            return self._fill(peer, now)
        return self._accept(index, now)

    def _accept(self, index: int, now: float, fill: bool = True, announce: bool = True) -> list[Action]:
        out: list[Action] = [StorePiece(index)] if fill else []
        self.have[index] = True
        self.held += 1
        self.missing.discard(index)
        self.pending_mask[index] = False
        for other in self.pending.pop(index, set()):  # endgame: the other copies are no longer wanted
            other_state = self.peers[other]
            del other_state.requested[index]
            other_state.cancelled.add(index)
            out.append(Send(other, Cancel(index)))
        if announce:
            out += [Send(p, Have(index)) for p, s in self.peers.items() if not s.bits[index]]
        if not self.missing and self.wanted[index]:
            out.append(Completed())
        return out + self._fill_all(now) if fill else out

    def _fill_all(self, now: float) -> list[Action]:
        out: list[Action] = []
        names = list(self.peers)
        self.rng.shuffle(names)  # no peer is always served first
        for name in names:
            out += self._fill(name, now)
        return out

    def _fill(self, peer: str, now: float) -> list[Action]:
        """Top up the request pipeline to `peer`."""
        state = self.peers[peer]
        out: list[Action] = []
        if now < self._busy_until.get(peer, now):
            return out
        self._busy_until.pop(peer, None)
        if not state.requested and peer not in self._refusing:  # the stall clock starts when it starts owing us
            state.last_piece_at = now
        room = self.config.pipeline_depth - len(state.requested)
        picks = self.picker.pick(self, state, room) if room > 0 and self.missing else []
        for index in picks:
            self._ask(peer, state, index, now, out)
        while self.missing and len(state.requested) < self.config.pipeline_depth:
            index = self._endgame_pick(peer, state)
            if index is None:
                break
            self._ask(peer, state, index, now, out)
        return out

    def next_retry(self) -> float | None:
        """When the earliest busy backoff ends (None if none): the adapter ticks then, not a whole tick later."""
        return min(self._busy_until.values(), default=None)

    def _ask(self, peer: str, state: PeerState, index: int, now: float, out: list[Action]) -> None:
        state.requested[index] = now
        self.pending.setdefault(index, set()).add(peer)
        self.pending_mask[index] = True
        out.append(Send(peer, Request(index)))

    def _endgame_pick(self, peer: str, state: PeerState) -> int | None:
        """Once every missing piece is requested, ask this peer too for the least-duplicated one it holds."""
        if not self.config.endgame or len(self.pending) < len(self.missing):
            return None
        best, best_key = None, None
        for i, asked in self.pending.items():
            if peer in asked or not state.bits[i] or state.timed_out[i] or len(asked) >= self.config.endgame_copies:
                continue
            key = (len(asked), self.rank[i])
            if best_key is None or key < best_key:
                best, best_key = i, key
        return best

    def tick(self, now: float) -> list[Action]:
        """Re-issue requests outstanding too long; drop peers that owe pieces and have gone silent; ask again the
        peers whose busy backoff has passed. Refusing as BUSY a piece nobody else holds is silence too."""
        out: list[Action] = []
        for peer in list(self.peers):
            state = self.peers[peer]
            if not state.requested and peer in self._refusing and not self._only_holder(state):
                state.last_piece_at = now  # we can get all it refuses elsewhere: not waiting on it
            if (state.requested or peer in self._refusing) and now - state.last_piece_at > self.config.stall_timeout:
                out += self._drop(peer, "sent nothing for too long while owing pieces", now, hostile=False)
                continue
            for index, asked_at in list(state.requested.items()):
                if now - asked_at > self.config.request_timeout:
                    del state.requested[index]
                    state.cancelled.add(index)
                    state.timed_out[index] = True
                    self._unpend(index, peer)
                    out.append(Send(peer, Cancel(index)))
        return out + self._fill_all(now)

    def _only_holder(self, state: PeerState) -> bool:
        """Whether the peer holds a piece we lack that no other connected peer holds."""
        return bool((state.bits & self.wanted & ~self.have & (self.availability <= 1)).any())

    # ------------------------------------------------------------------ uploading

    def peer_request(self, peer: str, index: int, now: float) -> list[Action]:
        """Queue a request, counted before a duplicate is folded (or the flood limit would never see one)."""
        state = self.peers.get(peer)
        if state is None:
            return []
        state.open_requests += 1
        state.asked = True
        if state.open_requests > self.config.max_queued_requests:  # an honest peer stays within its pipeline
            return self._drop(peer, "flooded us with requests", now)
        if index in state.delivered:
            return self._drop(peer, f"asked again for piece {index}, which it already received on this link", now)
        if not self.have[index]:
            return [Send(peer, Reject(index, "missing"))]
        if self.ledger.exhausted(peer):
            return self._drop(peer, f"took {self.ledger.sent(peer)} pieces of a {self.num_pieces}-piece version "
                                    "without serving enough back", now)
        if index in state.queue or index in state.sending:
            return []
        if self._refuses(state):
            state.open_requests -= 1  # answered: an honest peer asks again only after its backoff
            return self._refuse_busy(peer, state, index, now)
        state.queue.append(index)
        return self._schedule_uploads(now)

    def _refuse_busy(self, peer: str, state: PeerState, index: int, now: float) -> list[Action]:
        """Reject(BUSY), unless the peer had more refusals within one backoff than twice its pipeline: an honest
        requester has at most its pipeline in flight when the first refusal lands, then waits out the backoff."""
        if now - state.refused_since >= self.config.busy_backoff:
            state.refused_since, state.refusals = now, 0
        state.refusals += 1
        if state.refusals > 2 * self.config.pipeline_depth:
            return self._drop(peer, "kept asking through its busy refusals", now)
        return [Send(peer, Reject(index, BUSY))]

    def _refuses(self, state: PeerState) -> bool:
        """Every upload slot busy and either `upload_backlog` requests queued or one of this peer's: one place per
        peer while loaded, so no requester holds the backlog, and with it every freed slot. Never a super-seed,
        and never while the request would start sending within `busy_backoff`: a refusal would cost more."""
        if self.super_seeding or self._uploads_active < self.config.upload_slots:
            return False
        queued = sum(len(s.queue) for s in self.peers.values())
        if not state.queue and queued < self.config.upload_backlog:
            return False
        ahead, cfg = self._uploads_active + queued, self.config
        return not self.upload_timer.drains_within(ahead, cfg.upload_slots, cfg.busy_backoff)

    def peer_cancel(self, peer: str, index: int, now: float) -> list[Action]:
        """Forget a queued request. A super-seed also withdraws the piece's promise to that peer: a promise the
        peer will not collect would block that piece's first copy, and with it the whole first round, forever."""
        state = self.peers.get(peer)
        if state is None:
            return []
        if index in state.queue:
            state.queue.remove(index)
            state.open_requests -= 1
        elif index in state.delivered and index not in state.forgiven:  # our copy crossed its cancel: ask once more
            state.delivered.discard(index)
            state.forgiven.add(index)
        if index not in state.revealed:
            return []
        state.revealed.discard(index)
        out: list[Action] = []
        for name in [n for n in self.peers if n != peer] + [peer]:  # offered to the others before the canceller
            out += reveal(self, name, now)
        return out

    def upload_done(self, peer: str, index: int, now: float, delivered: bool = True) -> list[Action]:
        """The adapter finished sending a SendPiece (`delivered`) or gave up on it: free its slot."""
        state = self.peers.get(peer)
        if state is None or index not in state.sending:
            return []
        state.sending.discard(index)
        self._uploads_active -= 1
        self.upload_timer.ended(peer, index, now, delivered)
        if delivered:
            state.delivered.add(index)
            self.ledger.note_sent(peer)
        return self._schedule_uploads(now) + reveal_all(self, now)

    def reveal_lapsed(self, now: float) -> list[Action]:
        """Super-seed: reveal the pieces whose promises lapsed (their peers never asked within `reveal_grace`); the
        adapter calls this now and then, since a complete seed gets no other event while its peers wait."""
        return reveal_all(self, now)

    def _schedule_uploads(self, now: float) -> list[Action]:
        """Hand free upload slots round-robin to peers with queued requests."""
        out: list[Action] = []
        names = list(self.peers)
        while self._uploads_active < self.config.upload_slots and names:
            waiting = [n for n in names if self.peers[n].queue]
            if not waiting:
                break
            self._rr = (self._rr + 1) % len(waiting)
            name = waiting[self._rr]
            state = self.peers[name]
            index = state.queue.popleft()
            state.open_requests -= 1
            state.sending.add(index)
            self.upload_timer.started(name, index, now)
            self._uploads_active += 1
            self.sent_count[index] += 1
            state.revealed.discard(index)  # a revealed piece counts as promised only until it is sent
            # it will hold what we send it: never reveal that piece to it again (a peer does not tell a super-seed
            # about pieces it believes the seed holds, so without this the seed re-revealed pieces the peer had,
            # and with peers that cannot share it stopped after one copy of the file)
            if not state.bits[index]:
                state.bits[index] = True
                state.held += 1
                self.availability[index] += 1
            out.append(SendPiece(name, index))
        return out
