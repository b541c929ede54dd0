"""How a rollout group rides a gossip body: inline (zlib-compressed when that helps) or announced by hash.

Pure: bytes and plain values in, a `RolloutGroup`, an `Announcement` or a `RolloutRefused` out; no IO, no clock
(the blob cache takes `now` from its caller). swarm.messages.rollout_transport moves the bytes.

Why: py-libp2p drops pubsub messages of 1 MiB and more, and a reasoning-model group (16 completions of up to 24k
tokens, a logprob and ~8 proof bytes per token) is several MB. Compression brings such a group to about three
quarters (float32-valued logprobs compress, TOPLOC proofs and high-entropy token ids hardly), so a group whose
compressed blob still does not fit is announced by the BLAKE3 of that blob and fetched from its worker
(docs/architecture.md#wire-messages, RolloutGroup).

Gossip bodies on the "rollout" topic (the announcement rides the same topic as the groups, so every consumer of
rollouts sees both in one subscription):
- {"group": wire dict}                       the plain form (used when compression does not shrink the group);
- {"z": zlib(group.encode()), "n": raw size} compressed inline;
- {"ann": {"id", "size", "n", "worker", "rollout", "version", "run", "step", "dataset", "task", "addrs"}}
                                             announced: the blob is fetched by id; the group's slot rides along,
                                             since it decides who checks the group (verify.votes);
- {"batch": [body, ...]}                     several of the above from one worker (its groups of one version),
                                             within `inline_bytes` together: one gossip message instead of one per
                                             group, since every message floods the run at a fixed CPU cost per
                                             delivery. Each item is parsed, checked and refused on its own.

Every bound is checked before the work it protects: the declared sizes before fetching, the blob's length and
BLAKE3 before inflating it, the inflated size while inflating (a zip bomb stops at its declared size), and the
schema, the rollout id and the slot (worker included) after decoding. What a gossip body may declare is bounded by
what a receiver accepts inline (`max_inline_raw_bytes` for all its items together), not by the largest group, and
gossip's validator (parse_items_strictly) stops at the first item refused and asks a node-wide allowance before
inflating each one, so neither one body nor many senders together make a receiver inflate more than it accepts.
"""

from __future__ import annotations

import collections
import zlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import blake3
import msgpack

from verify.rollout import MAX_TEXT, RolloutGroup, RolloutSchemaError, Slot

ID_BYTES = 32
MAX_BATCH_ITEMS = 64
"""Bodies in one {"batch": [...]} at most; a longer list is refused unread."""
MAX_ADDRS = 4
MAX_ADDR_CHARS = 256
ANNOUNCEMENT_KEYS = frozenset({"id", "size", "n", "worker", "rollout", "version", "run", "step", "dataset", "task",
                               "addrs"})
"""The only fields an announcement has; one more (or one fewer) refuses it, so what a receiver forwards is exactly
what it read."""


@dataclass(frozen=True)
class TransportLimits:
    """Sizes that decide how a group travels and what a receiver accepts. Bytes throughout."""

    inline_bytes: int = 800 * 1024
    """Largest payload (compressed blob or plain encoding) put inside a gossip body; the envelope limit is 900 KiB
    and py-libp2p silently drops messages of 1 MiB, so this leaves room for the envelope around it."""
    max_group_bytes: int = 64 << 20
    """Largest decoded group accepted or published (the inflation bound). FastCuRL's 24k-token stage with 16
    completions is about 8 MiB; a worker cannot make a receiver inflate more than this."""
    max_inline_raw_bytes: int = 4 << 20
    """Largest inflated size of the compressed groups one gossip body carries, all its items together. A group
    that would inflate to more is announced by hash instead (pack_group, batch_bodies), so a receiver refuses a
    body declaring more before inflating a byte. Honest groups shrink to about three quarters, so an 800 KiB blob
    inflates to about 1.1 MiB; a zip bomb could declare a thousand times its size."""
    node_inflate_bytes_per_s: float = 16 << 20
    """Inflated bytes per second one node spends on gossip bodies in the long run, over every sender together
    (gossip_bodies.run_decoders): above what gossip's node-wide admission of 8 MiB/s of envelopes inflates to
    honestly, far below what 1,000 senders of one bomb each would declare."""
    node_inflate_burst_bytes: float = 32 << 20
    """Inflated bytes one node spends on gossip bodies at once."""
    max_blob_bytes: int = 64 << 20
    """Largest compressed blob a receiver fetches (zlib never grows data by more than a few bytes per 16 KiB)."""
    level: int = 1
    """zlib level. Measured on a synthetic 7.8 MiB group (16 x 24k tokens): level 1 gives 0.75 of the size in
    0.6 s, level 6 0.72 in 2.4 s; proofs and logprob mantissas are near-random, so the extra effort buys little."""

    @property
    def inline_raw_limit(self) -> int:
        """The most one gossip body may inflate to: what a receiver accepts inline, and never above one group."""
        return min(self.max_inline_raw_bytes, self.max_group_bytes)

    def __post_init__(self) -> None:
        if min(self.inline_bytes, self.max_group_bytes, self.max_blob_bytes, self.max_inline_raw_bytes,
               self.node_inflate_bytes_per_s) <= 0 or not 0 <= self.level <= 9:
            raise ValueError("transport limits must be positive and the zlib level within 0..9")
        if self.node_inflate_burst_bytes < self.max_inline_raw_bytes:
            raise ValueError("node_inflate_burst_bytes must hold one body's max_inline_raw_bytes")


DEFAULT_LIMITS = TransportLimits()


class RolloutRefused(Exception):
    """A rollout body or blob that is refused; `reason` is a short code, `hostile` says it cannot be an accident
    (the sender signed an envelope whose content lies), so the sender is scored down for it."""

    def __init__(self, reason: str, message: str, hostile: bool = True) -> None:
        super().__init__(message)
        self.reason = reason
        self.hostile = hostile


@dataclass(frozen=True)
class Announcement:
    """A group too large for gossip, named by the hash of its compressed blob; the worker serves the blob."""

    blob_id: bytes
    """BLAKE3 (32 bytes) of the compressed blob: the only name the blob is requested and verified by."""
    size: int
    """Exact length of the compressed blob in bytes."""
    raw_size: int
    """Exact length of the inflated group encoding (the inflation stops there)."""
    worker: str
    """Peer id of the worker; must equal the envelope's sender (the only peer asked for the blob)."""
    rollout_id: bytes
    """The group's rollout id (BLAKE3 of its canonical encoding), checked after decoding, so an announcement names
    exactly one group's bytes. It never decides who checks the group: the slot below does."""
    policy_version: int
    """The policy version that generated the group, checked after decoding (for staleness checks before fetching)."""
    addrs: tuple[str, ...]
    """The worker's listen multiaddrs, each ending in /p2p/<worker>, for receivers not yet connected to it."""
    run: str
    """The group's run; with `step`, `dataset` and `task_index` (and the worker and version above) it names the
    group's slot, which decides the validators that fetch it. Checked after decoding: a group of another slot than
    announced is a lie that costs its worker."""
    step: int
    """The group's assignment step."""
    dataset: str
    """The task set of the group's prompt."""
    task_index: int
    """The index of the group's prompt in that task set."""

    def slot(self) -> Slot:
        """The slot the announced group answers, known before fetching (verify.votes.assign_validators)."""
        return Slot(self.run, self.policy_version, self.worker, self.step, self.dataset, self.task_index)

    def to_wire(self) -> dict:
        return {"id": self.blob_id, "size": self.size, "n": self.raw_size, "worker": self.worker,
                "rollout": self.rollout_id, "version": self.policy_version, "run": self.run, "step": self.step,
                "dataset": self.dataset, "task": self.task_index, "addrs": list(self.addrs)}


@dataclass(frozen=True)
class Outgoing:
    """What a worker sends for one group: the gossip body, plus the blob to keep serving when it is announced."""

    body: dict
    blob: bytes | None = None
    """The compressed blob an announcement names (None when the group travels inline)."""
    announcement: Announcement | None = None


def pack_group(group: RolloutGroup, addrs: tuple[str, ...] = (), limits: TransportLimits = DEFAULT_LIMITS) -> Outgoing:
    """The gossip body for `group`: plain or compressed inline when it fits, an announcement otherwise.

    Raises RolloutRefused("oversized", hostile=False) for a group above `max_group_bytes`, which no receiver would
    accept. Blocking (compression): call it from a worker thread for large groups.
    """
    raw = group.encode()
    if len(raw) > limits.max_group_bytes:
        raise RolloutRefused("oversized", f"a rollout group of {len(raw)} bytes exceeds the "
                             f"{limits.max_group_bytes}-byte limit every receiver applies", hostile=False)
    blob = zlib.compress(raw, limits.level)
    if len(raw) <= len(blob) and len(raw) <= limits.inline_bytes:
        return Outgoing({"group": group.to_wire()})
    if len(blob) <= limits.inline_bytes and len(raw) <= limits.inline_raw_limit:
        return Outgoing({"z": blob, "n": len(raw)})
    ann = Announcement(blake3.blake3(blob).digest(), len(blob), len(raw), group.worker, blake3.blake3(raw).digest(),
                       group.policy_version, _own_addrs(addrs, group.worker), group.run, group.step, group.dataset,
                       group.task_index)
    return Outgoing({"ann": ann.to_wire()}, blob, ann)


def parse_body(body: object, limits: TransportLimits = DEFAULT_LIMITS) -> RolloutGroup | Announcement:
    """A gossip body's group (inline forms) or its announcement; RolloutRefused for anything else."""
    if not isinstance(body, dict):
        raise RolloutRefused("schema", "a rollout body must be a map")
    if "group" in body:
        return _from_wire(body["group"])
    if "z" in body:
        blob, raw_size = body["z"], body.get("n")
        if not isinstance(blob, bytes) or not _is_size(raw_size):
            raise RolloutRefused("schema", "a compressed rollout needs bytes 'z' and a size 'n'")
        if raw_size > limits.inline_raw_limit:
            raise RolloutRefused("oversized", f"an inline rollout declares {raw_size} inflated bytes, above the "
                                 f"{limits.inline_raw_limit}-byte bound (larger groups are announced)")
        return decode_blob(blob, raw_size, limits)
    if "ann" in body:
        return parse_announcement(body["ann"], limits)
    raise RolloutRefused("schema", "a rollout body holds neither a group nor an announcement")


def batch_bodies(bodies: list[dict], limits: TransportLimits = DEFAULT_LIMITS) -> list[dict]:
    """pack_group bodies combined, in order, into as few gossip bodies as fit `inline_bytes`, MAX_BATCH_ITEMS and
    `max_inline_raw_bytes` inflated each; a body that ends up alone is sent as itself."""
    out: list[list[dict]] = []
    size = inflated = 0
    for body in bodies:
        body_size, body_inflated = len(msgpack.packb(body, use_bin_type=True)), _declared(body)
        if (not out or len(out[-1]) == MAX_BATCH_ITEMS or size + body_size > limits.inline_bytes
                or inflated + body_inflated > limits.inline_raw_limit):
            out.append([])
            size = inflated = 0
        out[-1].append(body)
        size += body_size
        inflated += body_inflated
    return [items[0] if len(items) == 1 else {"batch": items} for items in out]


def parse_items(body: object,
                limits: TransportLimits = DEFAULT_LIMITS) -> list[RolloutGroup | Announcement | RolloutRefused]:
    """Every item a gossip body carries (one, or a batch's), each a group, an announcement or its own refusal.

    RolloutRefused is raised only for a body refused as a whole: a batch that is not a list, empty or longer than
    MAX_BATCH_ITEMS, or a body declaring more inflated bytes in total than one body may carry.
    """
    return [_parsed_or_refusal(item, limits) for item in _bodies(body, limits)]


def parse_items_strictly(body: object, limits: TransportLimits = DEFAULT_LIMITS,
                         spend: Callable[[int], bool] | None = None) -> list[RolloutGroup | Announcement]:
    """Every item of a gossip body, or RolloutRefused for the first item refused: no item after it is inflated.

    Why: gossip's validator refuses the whole message for any refused item, so parsing on would only spend CPU
    and memory on a message that is dropped anyway. `spend(n)` is the node-wide allowance, asked for a compressed
    item's declared inflated size before it is inflated; False refuses it as "node_busy" (hostile=False: the
    node's budget is shared, the sender may be honest)."""
    items = []
    for item in _bodies(body, limits):
        declared = _declared(item)
        if declared and spend is not None and not spend(declared):
            raise RolloutRefused("node_busy", "this node inflates no more rollout bytes for now", hostile=False)
        parsed = _parsed_or_refusal(item, limits)
        if isinstance(parsed, RolloutRefused):
            raise parsed
        items.append(parsed)
    return items


def _bodies(body: object, limits: TransportLimits) -> list:
    """The bodies a gossip body carries (itself, or a batch's), once they declare no more inflated bytes together
    than a receiver accepts inline (a batch must not multiply the zip-bomb bound)."""
    items = body["batch"] if isinstance(body, dict) and "batch" in body else [body]
    if not isinstance(items, list) or not 0 < len(items) <= MAX_BATCH_ITEMS:
        raise RolloutRefused("schema", f"a rollout batch must list 1 to {MAX_BATCH_ITEMS} bodies")
    declared = sum(_declared(item) for item in items)
    if declared > limits.inline_raw_limit:
        raise RolloutRefused("oversized", f"a rollout body declares {declared} inflated bytes, above the "
                             f"{limits.inline_raw_limit}-byte bound (larger groups are announced)")
    return items


def _declared(body: object) -> int:
    """The inflated size a compressed inline body declares (0 for any other body)."""
    if isinstance(body, dict) and "z" in body and _is_size(body.get("n")):
        return body["n"]
    return 0


def _parsed_or_refusal(body: object, limits: TransportLimits) -> RolloutGroup | Announcement | RolloutRefused:
    try:
        return parse_body(body, limits)
    except RolloutRefused as exc:
        return exc
    except Exception as exc:  # noqa: BLE001 - an input nobody foresaw drops its own item, never the batch or peer
        return RolloutRefused("error", f"{type(exc).__name__}: {exc}", hostile=False)


def parse_announcement(obj: object, limits: TransportLimits = DEFAULT_LIMITS) -> Announcement:
    """Check an announcement's fields, types and declared sizes before anything is fetched for it."""
    d = obj if isinstance(obj, dict) else {}
    blob_id, rollout_id, worker, addrs = d.get("id"), d.get("rollout"), d.get("worker"), d.get("addrs")
    if not (d.keys() == ANNOUNCEMENT_KEYS and isinstance(blob_id, bytes) and len(blob_id) == ID_BYTES
            and isinstance(rollout_id, bytes) and len(rollout_id) == ID_BYTES and isinstance(worker, str)
            and 0 < len(worker) <= 128 and _is_size(d.get("size")) and _is_size(d.get("n"))
            and _is_size(d.get("version")) and _is_size(d.get("step")) and _is_size(d.get("task"))
            and _is_name(d.get("run")) and _is_name(d.get("dataset"))
            and isinstance(addrs, list) and len(addrs) <= MAX_ADDRS
            and all(isinstance(a, str) and len(a) <= MAX_ADDR_CHARS for a in addrs)):
        raise RolloutRefused("schema", "a rollout announcement has missing, extra or mistyped fields")
    if d["size"] > limits.max_blob_bytes or d["n"] > limits.max_group_bytes:
        raise RolloutRefused("oversized", f"announced rollout blob of {d['size']} bytes ({d['n']} inflated) "
                             "exceeds the limits")
    return Announcement(blob_id, d["size"], d["n"], worker, rollout_id, d["version"], _own_addrs(addrs, worker),
                        d["run"], d["step"], d["dataset"], d["task"])


def open_blob(blob: bytes, ann: Announcement, limits: TransportLimits = DEFAULT_LIMITS) -> RolloutGroup:
    """The group a fetched blob holds, after checking it is exactly what `ann` named. Blocking for large blobs."""
    if len(blob) != ann.size:
        raise RolloutRefused("size_mismatch", f"the blob is {len(blob)} bytes, the announcement said {ann.size}")
    if blake3.blake3(blob).digest() != ann.blob_id:
        raise RolloutRefused("hash_mismatch", "the blob does not hash to the announced id")
    group, raw = _inflate_and_parse(blob, ann.raw_size, limits)
    if blake3.blake3(raw).digest() != ann.rollout_id:  # raw is canonical, so this is group.rollout_id()
        raise RolloutRefused("id_mismatch", "the fetched group is not the one announced (its rollout id differs)")
    if group.slot() != ann.slot():  # the announced slot chose who fetched it: a lie there picks validators
        raise RolloutRefused("slot_mismatch", "the fetched group answers another slot (run, version, worker, step, "
                             "task) than its announcement named")
    return group


def decode_blob(blob: bytes, raw_size: int, limits: TransportLimits = DEFAULT_LIMITS) -> RolloutGroup:
    """Inflate at most `raw_size` bytes (refusing more: a zip bomb stops there) and parse the group."""
    return _inflate_and_parse(blob, raw_size, limits)[0]


def _inflate_and_parse(blob: bytes, raw_size: int, limits: TransportLimits) -> tuple[RolloutGroup, bytes]:
    if len(blob) > limits.max_blob_bytes or raw_size > limits.max_group_bytes:
        raise RolloutRefused("oversized", f"a rollout blob of {len(blob)} bytes ({raw_size} inflated) exceeds "
                             "the limits")
    inflater = zlib.decompressobj()
    try:
        raw = inflater.decompress(blob, raw_size + 1)
    except zlib.error as exc:
        raise RolloutRefused("schema", f"the rollout blob is not valid zlib data ({exc})") from None
    if len(raw) > raw_size or inflater.unconsumed_tail:
        raise RolloutRefused("bomb", f"the rollout blob inflates beyond its declared {raw_size} bytes")
    if len(raw) != raw_size or not inflater.eof or inflater.unused_data:
        raise RolloutRefused("schema", "the rollout blob is truncated, padded or shorter than declared")
    try:
        group = RolloutGroup.decode(raw)
    except RolloutSchemaError as exc:
        raise RolloutRefused("schema", str(exc)) from None
    if group.encode() != raw:  # extra keys or non-canonical numbers would make the rollout id ambiguous
        raise RolloutRefused("schema", "the rollout blob is not the canonical encoding of its group")
    return group, raw


def _from_wire(obj: object) -> RolloutGroup:
    try:
        return RolloutGroup.from_wire(obj)
    except RolloutSchemaError as exc:
        raise RolloutRefused("schema", str(exc)) from None


def _is_name(value: object) -> bool:
    """A run or task set name as the group schema bounds it (verify.rollout: 1..MAX_TEXT characters)."""
    return isinstance(value, str) and 0 < len(value) <= MAX_TEXT


def _is_size(value: object) -> bool:
    return type(value) is int and 0 <= value < 1 << 62


def _own_addrs(addrs: Iterable[object], worker: str) -> tuple[str, ...]:
    """Only addresses that name the worker itself: an announcement must not make receivers dial third parties."""
    return tuple(a for a in addrs if isinstance(a, str) and a.endswith(f"/p2p/{worker}"))[:MAX_ADDRS]


class BlobCache:
    """The announced blobs a worker keeps serving, bounded in bytes and in age. Sans-IO: callers pass `now`.

    Why the age bound: an announcement older than the envelope freshness window (300 s + 30 s of skew) is refused
    by every receiver, so its blob can never be asked for again. Why the byte bound: a worker publishing faster
    than receivers fetch must not grow without limit; the oldest blobs go first.
    """

    def __init__(self, max_bytes: int = 256 << 20, ttl_s: float = 330.0) -> None:
        if max_bytes <= 0 or ttl_s <= 0:
            raise ValueError("a blob cache needs a positive byte bound and lifetime")
        self.max_bytes = max_bytes
        self.ttl_s = ttl_s
        self.bytes = 0
        self._blobs: collections.OrderedDict[bytes, tuple[bytes, float]] = collections.OrderedDict()

    def put(self, blob_id: bytes, blob: bytes, now: float) -> bool:
        """Keep `blob` until `now + ttl_s` or until newer blobs need its room; False if it alone is too large."""
        if len(blob) > self.max_bytes:
            return False
        self._drop(blob_id)
        self._blobs[blob_id] = (blob, now + self.ttl_s)
        self.bytes += len(blob)
        self.expire(now)
        while self.bytes > self.max_bytes:
            self._drop(next(iter(self._blobs)))
        return True

    def get(self, blob_id: bytes, now: float) -> bytes | None:
        self.expire(now)
        entry = self._blobs.get(blob_id)
        return entry[0] if entry is not None else None

    def expire(self, now: float) -> None:
        while self._blobs:
            oldest, (_, until) = next(iter(self._blobs.items()))
            if until > now:
                return
            self._drop(oldest)

    def __len__(self) -> int:
        return len(self._blobs)

    def _drop(self, blob_id: bytes) -> None:
        entry = self._blobs.pop(blob_id, None)
        if entry is not None:
            self.bytes -= len(entry[0])
