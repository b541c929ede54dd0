"""What py-libp2p's validator runs on each received gossip message, before it is delivered or forwarded.

Order of the checks, cheapest first: the sender's allowance (p2p.gossip.admission, before a byte is decoded), the
envelope (p2p.gossip.envelope: size and container budgets while decoding, signature, freshness, replay), the
envelope's signer against the pubsub message's signer, then the kind's typed decoder. `GossipValidator` owns what
those checks remember (the admission's allowances, the replay filter, the envelopes it verified until they are
delivered) and hands every refusal, with its reason code, to whoever answers for it (p2p.gossip.penalties).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Mapping

import trio
from libp2p.peer.id import ID
from libp2p.pubsub.pb import rpc_pb2

from p2p.errors import EnvelopeError
from p2p.gossip.admission import AdmissionConfig, GossipAdmission
from p2p.gossip.envelope import Envelope, EnvelopePolicy, make_replay_filter, open_envelope
from p2p.gossip.parts import _BoundedMap

log = logging.getLogger("p2p.gossip")
BodyDecoder = Callable[[Envelope], object]
"""A kind's typed decoder: the verified envelope in, a frozen typed message out (Envelope.message), or
EnvelopeError naming what is wrong. It runs in the validator, so what it refuses is never delivered or forwarded."""


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


class GossipValidator:
    """The checks on every received message of one gossip session, and the envelopes they verified.

    `me` gives our own peer id (read per message: our own publishes are not checked), `refuse(forwarder, msg,
    reason)` is told of every refused message (it must not raise), `cache_size` bounds the envelopes verified and
    not yet delivered.
    """

    def __init__(self, run: str, clock: Callable[[], float], policy: EnvelopePolicy, admission: AdmissionConfig,
                 replay_capacity: int, cache_size: int, decoders: Mapping[str, BodyDecoder] | None, *,
                 me: Callable[[], ID], refuse: Callable[[ID, rpc_pb2.Message, str], None]) -> None:
        self.run = run
        self.clock = clock
        self.policy = policy
        self.admission = GossipAdmission(admission)
        self.decoders = dict(decoders or {})
        self._me = me
        self._refused = refuse
        self._replay = make_replay_filter(policy, replay_capacity)
        self._verified: _BoundedMap[bytes, Envelope] = _BoundedMap(cache_size)

    def for_kind(self, kind: str) -> Callable[[ID, rpc_pb2.Message], bool]:
        """py-libp2p runs this before it delivers or forwards a message: False drops it for good. It never raises
        (an exception here would escape py-libp2p's message task)."""
        def validate(forwarder: ID, msg: rpc_pb2.Message) -> bool:
            try:
                env = self.check(kind, forwarder, msg)
            except Refused as refusal:
                self._refused(forwarder, msg, refusal.reason)
                return _refuse(msg)
            except Exception as exc:  # noqa: BLE001 - a check nobody foresaw failing drops this message only
                log.warning("dropped a %s message from %s: %s: %s", kind, forwarder, type(exc).__name__, exc)
                self._refused(forwarder, msg, "bad_body")
                return _refuse(msg)
            if env is not None:
                self._verified[bytes(msg.from_id) + bytes(msg.seqno)] = env
            return True

        return validate

    def check(self, kind: str, forwarder: ID, msg: rpc_pb2.Message) -> Envelope | None:
        """The verified envelope with its typed message, in the order of their cost: the sender's allowance
        before a byte is decoded, the envelope, then the kind's typed body. Refused (a reason code) otherwise;
        None for our own publish (sealed by us, delivered to nobody here)."""
        origin = ID(bytes(msg.from_id))
        if origin == self._me():
            return None
        data = msg.data
        verdict = self.admission.admit(kind, str(origin), str(forwarder), len(data), trio.current_time())
        if verdict is not None:
            raise Refused(verdict)
        try:
            env = open_envelope(data, self.run, self.clock(), self.policy, self._replay, kind=kind)
            if env.sender_peer_id != str(origin):
                raise EnvelopeError("wrong_sender", "the envelope is signed by another peer than its publisher")
            decoder = self.decoders.get(kind)
            return env if decoder is None else dataclasses.replace(env, message=decoder(env))
        except EnvelopeError as exc:
            raise Refused(exc.reason) from None

    def take_verified(self, msg: rpc_pb2.Message) -> Envelope | None:
        """The envelope this validator verified for `msg` (py-libp2p delivers what passed), forgotten as it is
        taken; None for a message it never passed (our own, or one it no longer remembers)."""
        return self._verified.pop(bytes(msg.from_id) + bytes(msg.seqno), None)
