"""Who answers for a gossip message that was refused or could not be used: scores, bans and hang-ups.

A refusal costs the message's origin and, unless it is about rates that an honest relay cannot know, the peer that
handed it over; a handler's exception (`Ignored`, or one nobody foresaw) costs the envelope's sender. Past the
threshold (p2p.scores) the peer is banned: blacklisted in pubsub (nothing it sends or originates is read again),
its pubsub streams refused and its connection closed, until its ban ends. `GossipPenalties` owns the scores, the
peers banned and the feed of refusals; the session (p2p.gossip.service) lends it the pubsub blacklist and a
nursery to hang up in while the session runs.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import trio
from libp2p.peer.id import ID
from libp2p.pubsub.pb import rpc_pb2

from p2p.gossip.admission import BLAMELESS
from p2p.gossip.envelope import Envelope
from p2p.gossip.parts import GossipStats, Rejection
from p2p.host.p2p_host import P2PHost
from p2p.scores import PeerScores, ScoreConfig, Verdict

log = logging.getLogger("p2p.gossip")
TIMING_REASONS = ("rate_limited", "flooding", "too_old", "replayed")
"""Refusals a relay can bring about for an honest origin by holding its messages back (see reject_message)."""


class Ignored(Exception):
    """Raised by a handler for a message it cannot use (an announced manifest that does not verify, ...): the
    message is dropped and its sender scored by `reason`, as a message refused by the validator would be."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


class GossipPenalties:
    """The scores and bans of one gossip session's peers.

    `stats` is the session's record, of which this writes `rejected` and `bans`; `blacklist` and `unblacklist` put
    a peer on and off pubsub's blacklist; `session_nursery` gives the nursery a banned peer is hung up on in, or
    None before the session runs and once it closes (both are read at each ban, not kept).
    """

    def __init__(self, host: P2PHost, config: ScoreConfig, stats: GossipStats, queue_size: int, *,
                 blacklist: Callable[[ID], None], unblacklist: Callable[[ID], None],
                 session_nursery: Callable[[], trio.Nursery | None]) -> None:
        self.host = host
        self.stats = stats
        self.scores = PeerScores(config)
        self._blacklist = blacklist
        self._unblacklist = unblacklist
        self._session_nursery = session_nursery
        self._banned_ids: dict[str, ID] = {}
        # `rejections`: a bounded feed of refused envelopes for logs/status (the newest are dropped when unread).
        self._rejections_in, self.rejections = trio.open_memory_channel[Rejection](queue_size)

    def penalize(self, peer: str, reason: str) -> None:
        """Score `peer` (its base58 peer id) down for content that proved false after the envelope checks passed.

        Why public: some lies only show later, outside gossip (a rollout blob fetched by hash that does not match
        its announced id, an announced manifest that does not verify); they must cost the liar exactly what a
        forged envelope costs, bans included.
        """
        self.stats.rejected[reason] += 1
        self._score(ID.from_base58(peer), reason)

    def contain(self, env: Envelope, exc: BaseException) -> None:
        """Drop what `env` caused: penalise its sender and log one line (no traceback is kept)."""
        reason = exc.reason if isinstance(exc, Ignored) else "handler_error"
        sender = env.sender_peer_id
        log.warning("dropped a %s message from %s: %s", env.kind, sender,
                    str(exc) if isinstance(exc, Ignored) else f"{type(exc).__name__}: {exc}")
        exc.__traceback__ = None
        self.penalize(sender, reason)

    def reject_message(self, forwarder: ID, msg: rpc_pb2.Message, reason: str) -> None:
        """Count one refused message and score who is to blame for it.

        The origin signed the message's data (py-libp2p's strict signing), so it answers for the content; the
        forwarder answers too, since an honest relay refuses the same content and never forwards it. Timing is
        another matter: a relay can hold back an honest origin's messages and release them at once, late or in a
        burst, so rates, budgets, staleness and replays cost the origin only when it handed the message over
        itself, and never cost a relay."""
        self.stats.rejected[reason] += 1
        if reason in BLAMELESS:
            return  # shared budgets (the node's, the strangers', a relay's): honest traffic may be caught in them
        origin = ID(bytes(msg.from_id))
        relayed = forwarder != origin
        if not (relayed and reason in TIMING_REASONS):
            self._score(origin, reason)
        if relayed and reason not in TIMING_REASONS:
            self._score(forwarder, reason)

    def banned_peers(self) -> list[str]:
        return self.scores.banned(trio.current_time())

    def lift_ended_bans(self, now: float) -> None:
        """Take every peer whose ban has ended by `now` off pubsub's blacklist."""
        for peer in self.scores.tick(now):
            peer_id = self._banned_ids.pop(peer, None)
            if peer_id is not None:
                self._unblacklist(peer_id)

    def _score(self, peer_id: ID, reason: str) -> None:
        peer = str(peer_id)
        if peer == self.host.peer_id:
            return
        log.debug("rejected a message from %s: %s", peer, reason)
        banned = self.scores.penalize(peer, reason, trio.current_time()) is Verdict.BAN
        if banned:
            self._ban(peer, peer_id)
        try:
            self._rejections_in.send_nowait(Rejection(peer, reason, banned))
        except trio.WouldBlock:
            pass

    def _ban(self, peer: str, peer_id: ID) -> None:
        """Blacklist in pubsub (nothing it sends or originates is read or forwarded again), refuse its pubsub
        streams, and hang up on it, until the ban ends. A peer banned already is left as it is: every path that
        bans (refused messages, a handler's `Ignored`, the host's faults) may reach here for the same peer."""
        if peer in self._banned_ids:
            return
        log.warning("peer %s banned from gossip after repeated invalid messages", peer)
        self.stats.bans += 1
        self._banned_ids[peer] = peer_id
        self._blacklist(peer_id)
        inbound = getattr(self.host, "inbound", None)  # the host's memory of it: a stranger again when it returns
        if inbound is not None:
            inbound.forget(peer)
        nursery = self._session_nursery()
        if nursery is not None:
            nursery.start_soon(self._hang_up, peer_id)

    async def _hang_up(self, peer_id: ID) -> None:
        try:
            with trio.move_on_after(5.0):
                await self.host.libp2p.disconnect(peer_id)
        except Exception:  # noqa: BLE001 - a peer that already left needs no hanging up
            log.debug("disconnecting banned peer %s failed", peer_id, exc_info=True)
