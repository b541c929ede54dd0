"""The typed gossip bodies of a run: one decoder per kind, run by gossip's validator before delivery or forwarding.

Rules of this module: a verified envelope in (p2p.gossip.envelope has already bounded its size, its maps and arrays and
refused NaN and infinities), a frozen typed value out, or EnvelopeError("bad_body") naming the first problem; no
IO, no clock. Handlers read only these values, never the raw maps. Strict on purpose: an unknown field, a list
longer than the bound or a mistyped entry refuses the whole message, because what a handler would have to skip is
exactly what must not be forwarded to the rest of the run, and it costs the sender (p2p.scores "bad_body").

Kinds: heartbeat (Heartbeat), manifest (ManifestAnnouncement), vote (VoteBatch: every vote parsed, signed by the
sender), rollout (RolloutMessage: swarm.messages.rollout_codec's items, every one usable, each naming its own slot).
DECODERS maps each to its decoder; a node subscribes to these kinds only, so a message on any other topic of the
run is never forwarded.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from dataclasses import dataclass
from types import MappingProxyType
from typing import Callable, Mapping

import trio

from p2p.errors import EnvelopeError
from p2p.gossip.envelope import Envelope
from p2p.ratelimit import Allowance
from swarm.messages.manifest_check import ManifestSignatures
from swarm.messages.rollout_codec import DEFAULT_LIMITS, TransportLimits
from swarm.messages.rollout_transport import items_or_refusal
from swarm.messages.votes import MAX_VOTES
from verify.votes import Vote, VoteError, verify_vote

ID_BYTES = 32
MAX_ROLES = 4
MAX_ROLE_CHARS = 32
MAX_ADDRS = 8
MAX_ADDR_CHARS = 256
MAX_POLICIES = 16
MAX_PROGRESS = 8
MAX_PROGRESS_KEY = 32
MAX_PROGRESS_TEXT = 40
REASON = "bad_body"
ProgressValue = bool | int | float | str | None
"""One figure of a peer's progress in its heartbeats: a count, a reward, a stage name (swarm.node.state.Node)."""


def _refuse(what: str) -> EnvelopeError:
    return EnvelopeError(REASON, what)


@dataclass(frozen=True)
class PolicyHeld:
    """One policy version a peer says it holds (complete) or is fetching."""

    version: int
    """Policy version, >= 0."""
    manifest_id: bytes
    """BLAKE3 of the version's manifest (32 bytes)."""
    complete: bool
    """True once every piece is held and verified."""


@dataclass(frozen=True)
class Heartbeat:
    """What a peer says about itself every `heartbeat_every_s`: roles, where it listens, what it holds."""

    roles: tuple[str, ...]
    """Up to MAX_ROLES printable names."""
    addrs: tuple[str, ...]
    """Up to MAX_ADDRS multiaddrs, each ending in /p2p/<the sender's id>."""
    policies: tuple[PolicyHeld, ...]
    """Up to MAX_POLICIES versions held or being fetched."""
    progress: tuple[tuple[str, ProgressValue], ...]
    """Up to MAX_PROGRESS (name, value) milestones of its roles; values None, bool, int, finite float or short
    printable text (swarm.node.state.Node.note_progress)."""


@dataclass(frozen=True)
class ManifestAnnouncement:
    """A new policy version: its manifest id and version, and the signed manifest when it fits in gossip."""

    manifest_id: bytes
    version: int
    signed: bytes | None
    """The signed manifest bytes, or None: then it is fetched by id from the sender (swarm.policy.manifest_protocol)."""


@dataclass(frozen=True)
class VoteBatch:
    """A validator's votes of one batch, each parsed and signed by the envelope's sender."""

    votes: tuple


@dataclass(frozen=True)
class RolloutMessage:
    """The rollout groups and announcements one message carries, each parsed, checked, the sender's own and of a
    slot of its own. An announcement names its group's slot (swarm.messages.rollout_codec.Announcement.slot), which is
    what a validator needs to know whether the group is assigned to it before fetching it."""

    items: tuple


Decoder = Callable[[Envelope], Heartbeat | ManifestAnnouncement | VoteBatch | RolloutMessage]
"""A gossip kind's typed decoder: the envelope's body read once, at the edge, or an EnvelopeError."""


def printable(value: object, limit: int) -> bool:
    """A short string without control characters (a peer's newlines and terminal escapes would draw fake lines)."""
    return isinstance(value, str) and len(value) <= limit and value.isprintable()


def _fields(body: object, allowed: tuple[str, ...], what: str) -> dict:
    if not isinstance(body, dict) or not set(body) <= set(allowed):
        raise _refuse(f"a {what} body must be a map of at most the fields {', '.join(allowed)}")
    return body


def _bounded_list(value: object, limit: int, what: str) -> list:
    if value is None:
        return []
    if not isinstance(value, list) or len(value) > limit:
        raise _refuse(f"a heartbeat's {what} must be a list of at most {limit} entries")
    return value


def decode_heartbeat(env: Envelope) -> Heartbeat:
    body = _fields(env.body, ("roles", "addrs", "policies", "progress"), "heartbeat")
    sender = env.sender_peer_id
    roles = _bounded_list(body.get("roles"), MAX_ROLES, "roles")
    if not all(printable(r, MAX_ROLE_CHARS) for r in roles):
        raise _refuse(f"heartbeat roles must be printable names of at most {MAX_ROLE_CHARS} characters")
    addrs = _bounded_list(body.get("addrs"), MAX_ADDRS, "addrs")
    if not all(printable(a, MAX_ADDR_CHARS) and a.endswith(f"/p2p/{sender}") for a in addrs):
        raise _refuse("heartbeat addresses must be short multiaddrs ending in the sender's own /p2p/ id")
    policies = tuple(_policy(entry) for entry in _bounded_list(body.get("policies"), MAX_POLICIES, "policies"))
    return Heartbeat(tuple(roles), tuple(addrs), policies, _progress(body.get("progress")))


def _policy(entry: object) -> PolicyHeld:
    if not (isinstance(entry, list) and len(entry) == 3 and type(entry[0]) is int and entry[0] >= 0
            and isinstance(entry[1], bytes) and len(entry[1]) == ID_BYTES and type(entry[2]) is bool):
        raise _refuse("a heartbeat policy entry must be [version >= 0, 32-byte manifest id, complete flag]")
    return PolicyHeld(entry[0], entry[1], entry[2])


def _progress(raw: object) -> tuple[tuple[str, ProgressValue], ...]:
    if raw is None:
        return ()
    if not isinstance(raw, dict) or len(raw) > MAX_PROGRESS:
        raise _refuse(f"heartbeat progress must be a map of at most {MAX_PROGRESS} fields")
    for key, value in raw.items():
        if not printable(key, MAX_PROGRESS_KEY) or not (
                value is None or type(value) in (bool, int, float) or printable(value, MAX_PROGRESS_TEXT)):
            raise _refuse("heartbeat progress holds a field that is not a short name with a plain value")
    return tuple(sorted(raw.items()))


def sendable_progress(progress: Mapping[str, ProgressValue]) -> dict[str, ProgressValue]:
    """The part of a node's own progress that receivers accept (decode_heartbeat): a reward that became NaN, a
    long stage name or an odd value is left out rather than getting every heartbeat of the peer refused."""
    out = {}
    for key, value in progress.items():
        if isinstance(value, float) and not math.isfinite(value):
            continue
        if printable(key, MAX_PROGRESS_KEY) and (
                value is None or type(value) in (bool, int, float) or printable(value, MAX_PROGRESS_TEXT)):
            out[key] = value
    return dict(list(out.items())[:MAX_PROGRESS])


def decode_manifest_announcement(env: Envelope) -> ManifestAnnouncement:
    body = _fields(env.body, ("id", "version", "signed"), "manifest announcement")
    manifest_id, version, signed = body.get("id"), body.get("version"), body.get("signed")
    if not (isinstance(manifest_id, bytes) and len(manifest_id) == ID_BYTES and type(version) is int
            and version >= 0 and (signed is None or isinstance(signed, bytes))):
        raise _refuse("a manifest announcement needs a 32-byte id, a version >= 0 and, if any, signed bytes")
    return ManifestAnnouncement(manifest_id, version, signed)


def decode_votes(env: Envelope) -> VoteBatch:
    """Every vote must parse, be signed by its validator and that validator must be the sender: the trainer
    would drop anything else, so nothing else is forwarded."""
    body = _fields(env.body, ("votes", "vote"), "vote")
    wires = [body["vote"]] if set(body) == {"vote"} else body.get("votes")  # {"vote": wire}: one vote alone
    if not isinstance(wires, list) or not 0 < len(wires) <= MAX_VOTES:
        raise _refuse(f"a vote body must list 1 to {MAX_VOTES} votes")
    votes = []
    for wire in wires:
        try:
            vote = Vote.from_wire(wire)
        except VoteError as exc:
            raise _refuse(f"a vote does not parse: {exc}") from None
        if vote.validator != env.sender or not verify_vote(vote):
            raise _refuse("a vote is not signed by the peer that sent it")
        votes.append(vote)
    return VoteBatch(tuple(votes))


def decode_rollouts(env: Envelope, spend: Callable[[int], bool] | None = None) -> RolloutMessage:
    """swarm.messages.rollout_codec's items of the body; any refused item, one of another worker, or two items for one
    slot (an honest worker answers a slot once) refuse the message. The refusal keeps no traceback (its frames hold the
    inflated buffers of compressed groups). `spend` is the node's inflation allowance (run_decoders): what it
    refuses is refused as "node_busy", which costs the sender nothing."""
    items, refusal = items_or_refusal(env.body, spend=spend)
    if refusal is not None:
        reason = "node_busy" if refusal.reason == "node_busy" else REASON
        raise EnvelopeError(reason, f"a rollout item is refused: {refusal} ({refusal.reason})")
    sender = env.sender_peer_id
    if any(getattr(item, "worker", None) != sender for item in items):
        raise _refuse("a rollout item names another worker than its sender")
    if len({item.slot().key() for item in items}) < len(items):
        raise _refuse("a rollout message carries two items for one slot")
    return RolloutMessage(tuple(items))


SENDER_INFLATE_SHARE = 0.25
"""Share of the node's inflation allowance (rate and burst, the burst at least one body's) one sender may spend:
above what an honest worker sends at gossip's per-sender byte rate (2 MiB/s compressed, about 2.7 MiB/s
inflated)."""
INFLATE_SENDERS = 4096
"""Senders whose share is remembered, the least recently heard forgotten first."""


def run_decoders(trainer_key: Callable[[], bytes | None], now: Callable[[], float] = trio.current_time,
                 limits: TransportLimits = DEFAULT_LIMITS,
                 signatures: ManifestSignatures | None = None) -> Mapping[str, Decoder]:
    """DECODERS for one node that knows (or will learn) its run's trainer key. `trainer_key()` is read per message
    (a first-use key is pinned later); node-wide allowances are read at `now()`.

    - An inline manifest is forwarded only once its signature verifies against the trainer key (before a key is
      pinned, the key it names) and it is the manifest announced (swarm.messages.manifest_check; `signatures`
      holds its node-wide allowance and the manifests verified already).
    - Compressed rollouts draw on one allowance of inflated bytes for the whole node (`limits`' node_inflate_*),
      so any number of senders together inflate no more than it allows, and each sender on its own share of it
      (SENDER_INFLATE_SHARE, for the INFLATE_SENDERS senders heard last). Why a share: gossip admits a message by
      its compressed size, and groups that compress a hundredfold (long runs of one token) cost their sender a
      few messages a second to spend the whole allowance, every other worker's compressed groups refused."""
    checks = signatures if signatures is not None else ManifestSignatures()
    inflation = Allowance(limits.node_inflate_bytes_per_s, limits.node_inflate_burst_bytes)
    shares: OrderedDict[bytes, Allowance] = OrderedDict()

    def spend(sender: bytes, size: int) -> bool:
        share = shares.pop(sender, None) or Allowance(
            limits.node_inflate_bytes_per_s * SENDER_INFLATE_SHARE,
            max(limits.max_inline_raw_bytes, limits.node_inflate_burst_bytes * SENDER_INFLATE_SHARE))
        shares[sender] = share
        while len(shares) > INFLATE_SENDERS:
            shares.popitem(last=False)
        at = now()
        return share.available(at) >= size and inflation.take(size, at) and share.take(size, at)

    def decode_announcement(env: Envelope) -> ManifestAnnouncement:
        ann = decode_manifest_announcement(env)
        if ann.signed is not None:
            checks.check(ann.signed, ann.manifest_id, ann.version, env.sender, trainer_key(), now())
        return ann

    def decode_node_rollouts(env: Envelope) -> RolloutMessage:
        return decode_rollouts(env, lambda size: spend(env.sender, size))

    return MappingProxyType({**DECODERS, "manifest": decode_announcement, "rollout": decode_node_rollouts})


DECODERS: Mapping[str, Decoder] = MappingProxyType({
    "heartbeat": decode_heartbeat,
    "manifest": decode_manifest_announcement,
    "vote": decode_votes,
    "rollout": decode_rollouts,
})
"""A run's gossip kinds and their decoders (p2p.gossip.service.open_gossip's `decoders`; its `kinds` are these keys)."""
