"""Signed gossip envelopes: `seal` on the way out, `open_envelope` on the way in. Pure: no IO, no clock.

Rules of this module: bytes and plain values in, bytes or a frozen `Envelope` out; every refusal on the receive
side is an `EnvelopeError` carrying a short reason code (peer scoring weighs rejections by it); `now` is always
passed in, so the freshness window is tested on a virtual clock.

Wire form: a msgpack map {v, kind, run, sender, ts, seq, body, sig}.
- sender: the raw 32-byte Ed25519 public key (the libp2p identity key, so the peer id is derived from it).
- ts: the sender's wall-clock seconds; receivers accept it within [now - max_age_s, now + max_future_s].
- seq: a per-sender counter; (sender, seq) is the replay key.
- body: a map or bytes; here only its structure, size and container count are checked, and its numbers must be
  finite (NaN and infinities are refused: no consumer can use them and JSON cannot print them). Each kind's
  typed decoder (gossip's `decoders`) checks its meaning.
- sig: Ed25519 over DOMAIN + the canonical msgpack of the other seven fields.

Why a canonical re-encoding rather than signing the received bytes: the receiver rebuilds the signed bytes from
the decoded values (map keys sorted at every level, floats as float64), so any encoder that produces the same
values verifies, and a relay re-encoding the map cannot break the signature. Why the DOMAIN prefix: the trainer key
also signs manifests and DHT records; a signature made for one of those must never verify as an envelope.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Mapping, TypeVar

import msgpack

from p2p.errors import EnvelopeError
from p2p.gossip.replay import ReplayFilter
from p2p.identity import Identity, peer_id_from_public_bytes
from p2p.packed import Packed

VERSION = 1
DOMAIN = b"rlswarm/envelope/v1\x00"
KINDS = ("manifest", "have", "rollout", "rollout_ann", "vote", "heartbeat")
FIELDS = ("v", "kind", "run", "sender", "ts", "seq", "body", "sig")
REASONS = (
    "malformed", "oversized", "bad_version", "unknown_kind", "wrong_run",
    "too_old", "from_future", "bad_signature", "replayed",
)
KEY_BYTES = 32
SIG_BYTES = 64
MAX_SEQ = 2**63 - 1
GOSSIP_MAX_BYTES = 900 * 1024  # pubsub drops messages of 1 MiB and more (docs/reference.md#py-libp2p-pitfalls)

DEFAULT_MAX_BYTES: Mapping[str, int] = MappingProxyType({
    "manifest": GOSSIP_MAX_BYTES,  # tensor index + per-piece hashes of a large policy
    "have": 64 * 1024,  # a have-map bitfield: 64 KiB covers 512k pieces
    "rollout": GOSSIP_MAX_BYTES,  # anything bigger goes out as a rollout_ann and is fetched by hash
    "rollout_ann": 4 * 1024,  # a hash, a size and a few ids
    "vote": 64 * 1024,  # a validator batch's votes with their per-check results (swarm.messages.votes: 48 KiB)
    "heartbeat": 8 * 1024,  # role, versions held, load
})

DEFAULT_MAX_CONTAINERS: Mapping[str, int] = MappingProxyType({
    "manifest": 16,  # {id, version, signed}: the signed manifest itself is one bin
    "have": 16,
    "rollout": 8 * 1024,  # a batch of groups: a map and two lists per completion (verify.rollout.MAX_CONTAINERS),
    # so about 2,700 completions in one message, each of about 340 bytes or more to fill it
    "rollout_ann": 16,
    "vote": 16 * 1024,  # 256 votes, each a map, a list of checks and one list per check
    "heartbeat": 128,  # roles, addrs, up to 16 policy entries, progress
})
"""Most maps and arrays one envelope of a kind may hold, counted while msgpack decodes it. Why: one byte of
msgpack is an empty map, and an empty map is 64 bytes of Python; decoded in full, 900 KiB of them take 127 MiB
and seconds of CPU before any check can look at them. Decoding stops at the first container past the budget;
counting costs about 1.3 us per container, so the largest budget bounds a refused message to about 10 ms of CPU."""


@dataclass(frozen=True)
class EnvelopePolicy:
    """What a receiver accepts. One policy per run; the defaults suit gossip over py-libp2p."""

    max_bytes: Mapping[str, int] = field(default_factory=lambda: DEFAULT_MAX_BYTES)
    """Largest wire size per kind, in bytes (the whole sealed envelope, signature included)."""
    max_age_s: float = 300.0
    """Oldest accepted timestamp, seconds before `now`: bounds both staleness and the replay filter's memory."""
    max_future_s: float = 30.0
    """Largest accepted clock skew into the future, in seconds."""
    max_depth: int = 16
    """Deepest nesting of lists and maps in a body (a hostile body must not exhaust the stack)."""
    max_containers: Mapping[str, int] = field(default_factory=lambda: DEFAULT_MAX_CONTAINERS)
    """Most maps and arrays per envelope, by kind, enforced while decoding (see DEFAULT_MAX_CONTAINERS)."""

    def __post_init__(self) -> None:
        if set(self.max_bytes) != set(KINDS) or min(self.max_bytes.values()) <= 0:
            raise ValueError(f"max_bytes must give a positive limit for each of {KINDS}")
        if set(self.max_containers) != set(KINDS) or min(self.max_containers.values()) < 2:
            raise ValueError(f"max_containers must allow at least 2 containers for each of {KINDS}")
        if self.max_age_s <= 0 or self.max_future_s < 0 or self.max_depth < 1:
            raise ValueError("max_age_s must be positive, max_future_s non-negative and max_depth at least 1")

    @property
    def largest(self) -> int:
        return max(self.max_bytes.values())


DEFAULT_POLICY = EnvelopePolicy()

Decoded = TypeVar("Decoded")


@dataclass(frozen=True)
class Envelope:
    """A verified envelope: only `open_envelope` and `seal`'s callers ever build one."""

    v: int
    """Wire version (1)."""
    kind: str
    """One of KINDS."""
    run: str
    """The run this message belongs to; envelopes of another run are refused."""
    sender: bytes
    """Raw 32-byte Ed25519 public key of the signer."""
    ts: float
    """Sender's wall-clock time at sealing, in seconds."""
    seq: int
    """Sender's sequence number (replay key together with `sender`)."""
    body: Packed
    """Opaque map or bytes, structurally checked (plain msgpack types, bounded depth)."""
    sig: bytes
    """Ed25519 signature over DOMAIN + canonical msgpack of the fields above."""
    message: object = field(default=None, compare=False)
    """The body as its kind's typed decoder read it (p2p.gossip.service's `decoders`); None where no decoder ran."""

    @property
    def sender_peer_id(self) -> str:
        """The libp2p peer id of the signer."""
        return peer_id_from_public_bytes(self.sender)

    def decoded(self, kind: type[Decoded]) -> Decoded:
        """The body as its topic's decoder read it, checked to be a `kind`: a handler names the type it reads
        instead of trusting an untyped field (a mismatch is a TypeError, which costs the message, not the node)."""
        if not isinstance(self.message, kind):
            raise TypeError(f"a {self.kind} envelope carries {type(self.message).__name__}, not {kind.__name__}")
        return self.message


def make_replay_filter(policy: EnvelopePolicy = DEFAULT_POLICY, capacity: int = 100_000) -> ReplayFilter:
    """A replay filter whose window covers every timestamp `policy` can accept."""
    return ReplayFilter(policy.max_age_s + policy.max_future_s, capacity)


def seal(
    kind: str, run: str, body: Packed, identity: Identity, ts: float, seq: int,
    policy: EnvelopePolicy = DEFAULT_POLICY,
) -> bytes:
    """Sign and encode one envelope; refuses (EnvelopeError) what a receiver would refuse: unknown kind, bad body,
    or a result above the kind's size or container limit (then split it, or announce the payload by hash)."""
    if kind not in KINDS:
        raise EnvelopeError("unknown_kind", f"unknown envelope kind {kind!r}; expected one of {', '.join(KINDS)}")
    if not isinstance(run, str) or type(seq) is not int or not 0 <= seq <= MAX_SEQ:
        raise EnvelopeError("malformed", "an envelope needs a str run and a seq in [0, 2**63)")
    if not isinstance(body, (dict, bytes)):
        raise EnvelopeError("malformed", "an envelope body must be a map or bytes")
    fields = {
        "v": VERSION, "kind": kind, "run": run, "sender": identity.public_bytes,
        "ts": float(ts), "seq": seq, "body": _canonical(body, policy.max_depth),
    }
    sig = identity.sign(_signed_bytes(fields))
    data = msgpack.packb({**fields, "sig": sig}, use_bin_type=True)
    limit = policy.max_bytes[kind]
    if len(data) > limit:
        raise EnvelopeError("oversized", f"a {kind} envelope of {len(data)} bytes exceeds its {limit}-byte limit")
    if count_containers(fields["body"]) + 1 > policy.max_containers[kind]:  # +1: the envelope's own map
        raise EnvelopeError("oversized", f"a {kind} envelope holds more than its {policy.max_containers[kind]} "
                            "maps and arrays (split it)")
    return data


def count_containers(value: Packed) -> int:
    """Maps and arrays in a plain value, itself included: what a receiver counts against max_containers."""
    if isinstance(value, dict):
        return 1 + sum(count_containers(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return 1 + sum(count_containers(v) for v in value)
    return 0


def open_envelope(
    data: bytes, run: str, now: float, policy: EnvelopePolicy = DEFAULT_POLICY,
    replay: ReplayFilter | None = None, kind: str | None = None,
) -> Envelope:
    """Decode and verify one envelope from the network; any defect raises EnvelopeError (never anything else).

    `kind`, when given (gossip knows it from the topic), sets the size and container limits before a byte is
    decoded, and an envelope of another kind is refused; without it the largest limits apply until the kind is
    read. The replay filter, when given, is consulted last, after the signature: a forger must not be able to burn
    an honest sender's sequence numbers.
    """
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise EnvelopeError("malformed", "an envelope must be bytes")
    if kind is not None and kind not in KINDS:
        raise EnvelopeError("unknown_kind", f"unknown envelope kind {kind!r}")
    limit = policy.max_bytes[kind] if kind is not None else policy.largest
    if len(data) > limit:
        raise EnvelopeError("oversized", f"an envelope of {len(data)} bytes exceeds the {limit}-byte limit")
    containers = policy.max_containers[kind] if kind is not None else max(policy.max_containers.values())
    fields = _decode_fields(bytes(data), policy, limit, containers)
    if kind is not None and fields["kind"] != kind:
        raise EnvelopeError("malformed", f"a {fields['kind']} envelope on the {kind} topic")
    if len(data) > policy.max_bytes[fields["kind"]]:
        raise EnvelopeError("oversized", f"a {fields['kind']} envelope of {len(data)} bytes exceeds its limit")
    if fields["run"] != run:
        raise EnvelopeError("wrong_run", f"envelope for run {fields['run']!r} received on run {run!r}")
    _check_fresh(fields["ts"], now, policy)
    sig = fields.pop("sig")
    if not Identity.verify(fields["sender"], _signed_bytes(fields), sig):
        raise EnvelopeError("bad_signature", "envelope signature does not verify against its sender key")
    if replay is not None and not replay.accept(fields["sender"], fields["seq"], fields["ts"], now):
        raise EnvelopeError("replayed", f"envelope seq {fields['seq']} from this sender was already seen")
    return Envelope(sig=sig, **fields)


def _decode_fields(data: bytes, policy: EnvelopePolicy, max_bytes: int, max_containers: int) -> dict[str, Packed]:
    """msgpack -> a dict of exactly FIELDS with the right types, body canonicalised; EnvelopeError otherwise.

    Bounded while decoding, never after: no string, blob, map or array may declare more than `max_bytes` entries
    or bytes, and decoding stops at the first map or array past `max_containers` (counted by msgpack's hooks,
    which run as each container completes)."""
    obj = _bounded_unpack(data, max_bytes, max_containers)
    if not isinstance(obj, dict) or set(obj) != set(FIELDS):
        raise EnvelopeError("malformed", f"envelope must be a map with exactly the fields {', '.join(FIELDS)}")
    if type(obj["v"]) is not int or obj["v"] != VERSION:
        raise EnvelopeError("bad_version", f"envelope version {obj['v']!r} is not {VERSION}")
    if not isinstance(obj["kind"], str) or obj["kind"] not in KINDS:
        raise EnvelopeError("unknown_kind", f"unknown envelope kind {obj['kind']!r}")
    _check_types(obj)
    obj["ts"] = float(obj["ts"])
    obj["body"] = _canonical(obj["body"], policy.max_depth)
    return obj


class _TooManyContainers(Exception):
    """Raised from inside msgpack's hooks to stop decoding at the container budget."""


def _bounded_unpack(data: bytes, max_bytes: int, max_containers: int) -> Packed:
    count = 0

    def counted(container: Packed) -> Packed:
        nonlocal count
        count += 1
        if count > max_containers:
            raise _TooManyContainers
        return container

    try:
        return msgpack.unpackb(
            data, raw=False, strict_map_key=False, use_list=True, object_hook=counted, list_hook=counted,
            max_str_len=max_bytes, max_bin_len=max_bytes, max_array_len=max_bytes, max_map_len=max_bytes,
            max_ext_len=0)
    except _TooManyContainers:
        raise EnvelopeError("oversized", f"envelope holds more than {max_containers} maps and arrays") from None
    except Exception as exc:  # noqa: BLE001 - msgpack raises many types on hostile input; all mean "malformed"
        raise EnvelopeError("malformed", f"envelope is not valid msgpack ({type(exc).__name__})") from None


def _check_types(obj: dict[str, Packed]) -> None:
    ok = (
        isinstance(obj["run"], str)
        and isinstance(obj["sender"], bytes) and len(obj["sender"]) == KEY_BYTES
        and isinstance(obj["sig"], bytes) and len(obj["sig"]) == SIG_BYTES
        and type(obj["ts"]) in (int, float) and math.isfinite(obj["ts"])
        and type(obj["seq"]) is int and 0 <= obj["seq"] <= MAX_SEQ
        and isinstance(obj["body"], (dict, bytes))
    )
    if not ok:
        raise EnvelopeError("malformed", "envelope field has the wrong type or size")


def _check_fresh(ts: float, now: float, policy: EnvelopePolicy) -> None:
    if ts < now - policy.max_age_s:
        raise EnvelopeError("too_old", f"envelope is {now - ts:.0f} s old (limit {policy.max_age_s:.0f} s)")
    if ts > now + policy.max_future_s:
        ahead, limit = ts - now, policy.max_future_s
        raise EnvelopeError("from_future", f"envelope is {ahead:.0f} s in the future (limit {limit:.0f} s)")


_SCALARS = (type(None), bool, int, float, str, bytes)
_KEY_ORDER = {int: 0, str: 1, bytes: 2}
_INT_MIN, _INT_MAX = -(2**63), 2**64 - 1


def _canonical(value: object, depth: int) -> Packed:
    """The body with every map's keys sorted (int < str < bytes, then by value), tuples as lists; refuses
    anything msgpack would not round-trip to the same value, and nesting deeper than `depth`."""
    if type(value) is int and not _INT_MIN <= value <= _INT_MAX:
        raise EnvelopeError("malformed", "envelope body holds an integer msgpack cannot encode")
    if type(value) is float and not math.isfinite(value):
        raise EnvelopeError("malformed", "envelope body holds a NaN or infinite number")
    if isinstance(value, _SCALARS):
        return value
    if depth <= 0:
        raise EnvelopeError("malformed", "envelope body is nested too deeply")
    if isinstance(value, (list, tuple)):
        return [_canonical(item, depth - 1) for item in value]
    if isinstance(value, dict):
        if not all(type(k) in _KEY_ORDER for k in value) or not all(_canonical(k, 1) == k for k in value):
            raise EnvelopeError("malformed", "envelope body map keys must be int, str or bytes")
        keys = sorted(value, key=lambda k: (_KEY_ORDER[type(k)], k))
        return {k: _canonical(value[k], depth - 1) for k in keys}
    raise EnvelopeError("malformed", f"envelope body holds a {type(value).__name__}, not a plain msgpack value")


def _signed_bytes(fields: Mapping[str, Packed]) -> bytes:
    ordered = {name: fields[name] for name in sorted(FIELDS) if name != "sig"}
    return DOMAIN + msgpack.packb(ordered, use_bin_type=True)
