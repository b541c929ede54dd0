"""Gossip's receive side: what py-libp2p's validator runs on each message, how refusals are scored and bans
enforced, and the scope each handled message runs in. A mixin of p2p.gossip.service.Gossip (which owns the state).

Order of the checks, cheapest first, all before a message is delivered or forwarded: the sender's allowance
(p2p.gossip.admission, before a byte is decoded), the envelope (p2p.gossip.envelope: size and container budgets while
decoding, signature, freshness, replay), the envelope's signer against the pubsub message's signer, then the
kind's typed decoder. A refusal costs the message's origin and, unless it is about rates that an honest relay
cannot know, the peer that handed it over; past the threshold the peer is banned: blacklisted in pubsub (nothing
it sends or originates is read again), its pubsub streams refused and its connection closed.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Awaitable, Callable

import trio
from libp2p.peer.id import ID
from libp2p.pubsub.pb import rpc_pb2

from p2p.errors import EnvelopeError
from p2p.gossip.admission import BLAMELESS
from p2p.gossip.envelope import Envelope, open_envelope
from p2p.gossip.parts import Rejection
from p2p.scores import Verdict

log = logging.getLogger("p2p.gossip")
BodyDecoder = Callable[[Envelope], object]
"""A kind's typed decoder: the verified envelope in, a frozen typed message out (Envelope.message), or
EnvelopeError naming what is wrong. It runs in the validator, so what it refuses is never delivered or forwarded."""


TIMING_REASONS = ("rate_limited", "flooding", "too_old", "replayed")
"""Refusals a relay can bring about for an honest origin by holding its messages back (see _reject_message)."""


def _refuse(msg: rpc_pb2.Message) -> bool:
    """False for py-libp2p, with the refused message's payload emptied first. Why: py-libp2p 0.8.1 writes the
    whole refused message into its ValidationError's text (protobuf text format, byte by byte: about 70 ms for a
    900 KiB message, most of what a refused message cost) and hex-encodes its data for a debug line. The message
    id is taken before validators run, and a refused message is neither cached nor forwarded, so nothing else
    reads the payload."""
    msg.data = b""
    return False


class Refused(Exception):
    """Internal: a received message the validator drops; `reason` is the code its sender is scored by."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class Ignored(Exception):
    """Raised by a handler for a message it cannot use (an announced manifest that does not verify, ...): the
    message is dropped and its sender scored by `reason`, as a message refused by the validator would be."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


class GossipReceiver:
    """The receive-side methods of p2p.gossip.service.Gossip (see the module docstring)."""

    def _validator(self, kind: str) -> Callable[[ID, rpc_pb2.Message], bool]:
        """py-libp2p runs this before it delivers or forwards a message: False drops it for good. It never raises
        (an exception here would escape py-libp2p's message task)."""
        def validate(forwarder: ID, msg: rpc_pb2.Message) -> bool:
            try:
                env = self._check(kind, forwarder, msg)
            except Refused as refusal:
                self._reject_message(forwarder, msg, refusal.reason)
                return _refuse(msg)
            except Exception as exc:  # noqa: BLE001 - a check nobody foresaw failing drops this message only
                log.warning("dropped a %s message from %s: %s: %s", kind, forwarder, type(exc).__name__, exc)
                self._reject_message(forwarder, msg, "bad_body")
                return _refuse(msg)
            if env is not None:
                self._verified[bytes(msg.from_id) + bytes(msg.seqno)] = env
            return True

        return validate

    def _check(self, kind: str, forwarder: ID, msg: rpc_pb2.Message) -> Envelope | None:
        """The verified envelope with its typed message, in the order of their cost: the sender's allowance
        before a byte is decoded, the envelope, then the kind's typed body. Refused (a reason code) otherwise."""
        origin = ID(bytes(msg.from_id))
        if origin == self.host.libp2p.get_id():
            return None  # our own publish: sealed by us, delivered to nobody here
        data = msg.data
        verdict = self.admission.admit(kind, str(origin), str(forwarder), len(data), trio.current_time())
        if verdict is not None:
            raise Refused(verdict)
        try:
            env = open_envelope(data, self.run, self.clock(), self.config.policy, self._replay, kind=kind)
            if env.sender_peer_id != str(origin):
                raise EnvelopeError("wrong_sender", "the envelope is signed by another peer than its publisher")
            decoder = self.decoders.get(kind)
            return env if decoder is None else dataclasses.replace(env, message=decoder(env))
        except EnvelopeError as exc:
            raise Refused(exc.reason) from None

    def penalize(self, peer: str, reason: str) -> None:
        """Score `peer` (its base58 peer id) down for content that proved false after the envelope checks passed.

        Why public: some lies only show later, outside gossip (a rollout blob fetched by hash that does not match
        its announced id, an announced manifest that does not verify); they must cost the liar exactly what a
        forged envelope costs, bans included.
        """
        self.stats.rejected[reason] += 1
        self._score(ID.from_base58(peer), reason)

    def _reject_message(self, forwarder: ID, msg: rpc_pb2.Message, reason: str) -> None:
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
        self.pubsub.add_to_blacklist(peer_id)
        inbound = getattr(self.host, "inbound", None)  # the host's memory of it: a stranger again when it returns
        if inbound is not None:
            inbound.forget(peer)
        if self._nursery is not None and not self._closing:
            self._nursery.start_soon(self._hang_up, peer_id)

    async def _hang_up(self, peer_id: ID) -> None:
        try:
            with trio.move_on_after(5.0):
                await self.host.libp2p.disconnect(peer_id)
        except Exception:  # noqa: BLE001 - a peer that already left needs no hanging up
            log.debug("disconnecting banned peer %s failed", peer_id, exc_info=True)

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
        reason = exc.reason if isinstance(exc, Ignored) else "handler_error"
        sender = env.sender_peer_id
        log.warning("dropped a %s message from %s: %s", env.kind, sender,
                    str(exc) if isinstance(exc, Ignored) else f"{type(exc).__name__}: {exc}")
        exc.__traceback__ = None
        self.penalize(sender, reason)
