"""Rollout groups over the network: publish (inline or announced), serve announced blobs, receive and verify.

The codec (swarm.messages.rollout_codec) decides; this module only moves bytes. A worker publishes its groups of a
version with `publish_groups`: small groups ride gossip bodies (several to a message), larger ones are announced by the
BLAKE3 of their compressed blob, which the worker keeps in a bounded `BlobCache` and serves on PROTOCOL. Receivers
(validators, the trainer) call `receive_envelope` on every "rollout" envelope: an announced group is fetched from
the envelope's sender (the only peer that can hold it), with bounded attempts and deadlines, verified, decoded, and
then handled exactly like a gossiped one. `receive_groups` does that for a whole subscription, several envelopes at
once, so a slow or silent announcer holds up only its own announcements, not every group behind it.

Request: the 32-byte blob id. Response: 4-byte big-endian length, then the blob (length 0: not held, e.g.
expired). The response is read in bounded chunks (py-libp2p's own readers fail above ~6.5 MiB,
docs/reference.md#py-libp2p-pitfalls).

Hostile input never crashes a receiver: a blob that does not hash to its id, does not match its announced size,
inflates past its declared size or fails the schema is dropped and its sender scored down in gossip (three lies
and it is banned); an announcer that never serves is scored down more gently (it may have restarted).
"""

from __future__ import annotations

import logging
import struct
from collections.abc import AsyncIterable, Callable
from dataclasses import dataclass
from typing import TypeVar

import trio

from p2p.errors import HostError
from p2p.gossip.envelope import DEFAULT_POLICY, Envelope, count_containers
from p2p.host.p2p_host import ensure_connected, read_exactly, reset_quietly
from swarm.messages.rollout_codec import (
    DEFAULT_LIMITS,
    ID_BYTES,
    Announcement,
    BlobCache,
    RolloutRefused,
    TransportLimits,
    batch_bodies,
    open_blob,
    pack_group,
    parse_items,
    parse_items_strictly,
)
from swarm.node.ports import HostPort, HostStream, PeerNetwork
from verify.rollout import RolloutGroup

log = logging.getLogger(__name__)

PROTOCOL = "/rl-swarm/rollout-blob/1.0.0"
_LEN = struct.Struct(">I")
_CHUNK = 1 << 20
LIE_REASON = "malformed"  # gossip's scores: -20, the weight of a forged envelope (a signed lie is no accident)
UNSERVED_REASON = "rollout_unserved"  # unknown to gossip's table: its default penalty (-10)


@dataclass(frozen=True)
class FetchConfig:
    """How hard a receiver tries to fetch an announced blob. Seconds of trio time.

    Why one deadline for all tries: a slow or silent announcer holds a fetch slot (`ReceiveFlow`) until the
    deadline, which bounds that per announcement (8 MiB: 9 s at most), and each failure scores the announcer down until
    gossip bans it.
    """

    attempts: int = 3
    """Tries per announcement (a reset stream or a dial that raced a connection is retried), within the deadline."""
    base_timeout_s: float = 5.0
    """Deadline for an empty blob: dialing, opening the stream and the request round trip."""
    min_rate_bps: float = 2 << 20
    """Slowest transfer tolerated; the deadline grows by size / this (8 MiB: 5 + 4 s)."""
    backoff_s: float = 0.5
    """Pause before the second try, doubled before each later one."""

    def __post_init__(self) -> None:
        if self.attempts < 1 or min(self.base_timeout_s, self.min_rate_bps) <= 0 or self.backoff_s < 0:
            raise ValueError("a fetch needs at least one attempt, positive timeouts and rate, a non-negative backoff")

    def timeout_for(self, size: int) -> float:
        return self.base_timeout_s + size / self.min_rate_bps


DEFAULT_FETCH = FetchConfig()


# ---- worker side -------------------------------------------------------------------------------------------------

def serve_rollout_blobs(host: HostPort, cache: BlobCache | None = None, max_concurrent: int = 4,
                        timeout_s: float = 120.0) -> BlobCache:
    """Serve the blobs of `cache` (a new one by default) on PROTOCOL and return the cache.

    At most `max_concurrent` uploads run at once (others wait within the handler's deadline), so a peer asking
    again and again cannot take a worker's whole upload.
    """
    cache = cache if cache is not None else BlobCache()
    slots = trio.CapacityLimiter(max_concurrent)

    async def handle(stream: HostStream) -> None:
        with trio.fail_after(10.0):
            blob_id = await read_exactly(stream, ID_BYTES, "rollout blob stream")
        blob = cache.get(blob_id, trio.current_time()) or b""
        async with slots:
            await stream.write(_LEN.pack(len(blob)))
            for start in range(0, len(blob), _CHUNK):
                await stream.write(blob[start:start + _CHUNK])
        await stream.close()

    host.set_guarded_handler(PROTOCOL, handle, timeout=timeout_s)
    return cache


async def publish_groups(node: PeerNetwork, groups: list[RolloutGroup], cache: BlobCache,
                         limits: TransportLimits = DEFAULT_LIMITS,
                         skipped: Callable[[RolloutGroup, RolloutRefused], None] | None = None) -> list[str]:
    """Gossip a worker's groups of one version in as few messages as fit: each inline (plain or compressed) or,
    when too large, its blob kept in `cache` and its announcement gossiped.

    Returns how each published group went out, in order: "plain", "compressed" or "announced". A group refused by
    the codec (above `limits.max_group_bytes`, or a blob the cache cannot hold) is left out and reported to
    `skipped(group, refusal)`. GossipError as from any publish.
    """
    bodies, hows = [], []
    for group in groups:
        try:
            body, how = await _packed(node, group, cache, limits)
        except RolloutRefused as exc:
            if skipped is not None:
                skipped(group, exc)
            continue
        bodies.append(body)
        hows.append(how)
    for batch in batch_bodies(bodies, limits):
        for body in within_containers(batch):
            await node.gossip.publish("rollout", body)
    return hows


def within_containers(body: dict, limit: int = DEFAULT_POLICY.max_containers["rollout"] - 1) -> list[dict]:
    """`body`, or its batch split in halves until each part holds at most `limit` maps and arrays, the bound a
    receiver decodes a rollout envelope within (p2p.gossip.envelope): many small groups fit the byte limit of one
    message long before they fit its container budget."""
    items = body.get("batch")
    if count_containers(body) <= limit or not isinstance(items, list) or len(items) < 2:
        return [body]
    half = len(items) // 2
    return within_containers({"batch": items[:half]}, limit) + within_containers({"batch": items[half:]}, limit)


async def _packed(node: PeerNetwork, group: RolloutGroup, cache: BlobCache,
                  limits: TransportLimits) -> tuple[dict, str]:
    """(gossip body, how it goes out) for one group; RolloutRefused (not hostile) when it cannot be published."""
    out = await trio.to_thread.run_sync(pack_group, group, tuple(node.host.multiaddrs), limits)
    if out.announcement is not None:
        if not cache.put(out.announcement.blob_id, out.blob, trio.current_time()):
            raise RolloutRefused("oversized", f"a {len(out.blob)}-byte blob does not fit the worker's blob cache",
                                 hostile=False)
    return out.body, "announced" if out.announcement is not None else ("plain" if "group" in out.body else "compressed")


# ---- receiver side -----------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class ReceiveFlow:
    """How many envelopes `receive_groups` handles at once.

    concurrent: envelopes in progress at a time (an announced one holds its slot for up to a fetch deadline);
    per_sender: of those, at most this many from one sender, so one slow or silent announcer can never take every
    slot; pending: envelopes accepted and not yet finished (waiting for a slot included), beyond which new ones are
    dropped with a warning (memory stays bounded under a flood; gossip already rate-limits each peer).
    """

    concurrent: int = 8
    per_sender: int = 2
    pending: int = 256

    def __post_init__(self) -> None:
        if not 1 <= self.per_sender <= self.concurrent <= self.pending:
            raise ValueError("receive flow needs 1 <= per_sender <= concurrent <= pending")


DEFAULT_FLOW = ReceiveFlow()


async def receive_groups(node: PeerNetwork, envelopes: AsyncIterable[Envelope],
                         deliver: Callable[[RolloutGroup], None],
                         refused: Callable[[str], None] | None = None, limits: TransportLimits = DEFAULT_LIMITS,
                         fetch: FetchConfig = DEFAULT_FETCH, wanted: Callable[[Announcement], bool] | None = None,
                         flow: ReceiveFlow = DEFAULT_FLOW) -> None:
    """receive_envelope on every envelope of the async iterable `envelopes`, handing each group to `deliver(group)`.

    Envelopes are handled concurrently within `flow`'s bounds, so groups may be delivered out of arrival order.
    Returns when `envelopes` ends and every envelope taken from it is finished.
    """
    slots = trio.CapacityLimiter(flow.concurrent)
    senders: dict[str, list] = {}  # sender -> [semaphore, envelopes of it in progress or waiting]
    pending = 0

    async def one(env: Envelope) -> None:
        nonlocal pending
        sender = env.sender_peer_id
        entry = senders.setdefault(sender, [trio.Semaphore(flow.per_sender), 0])
        entry[1] += 1
        try:
            async with entry[0], slots:
                groups = await receive_envelope(node, env, refused, limits, fetch, wanted)
            for group in groups:
                deliver(group)
        except Exception as exc:  # noqa: BLE001 - one envelope's fault drops it and costs its sender, never the role
            log.warning("rollout message from %s dropped: %s: %s", sender, type(exc).__name__, exc)
            exc.__traceback__ = None
            _score_down(node, sender, "handler_error")
        finally:
            pending -= 1
            entry[1] -= 1
            if not entry[1]:
                del senders[sender]

    async with trio.open_nursery() as nursery:
        async for env in envelopes:
            if pending >= flow.pending:
                log.warning("%d rollout envelopes already in progress; dropping one from %s", pending,
                            env.sender_peer_id)
                continue
            pending += 1
            nursery.start_soon(one, env)


async def receive_envelope(node: PeerNetwork, env: Envelope, refused: Callable[[str], None] | None = None,
                           limits: TransportLimits = DEFAULT_LIMITS, fetch: FetchConfig = DEFAULT_FETCH,
                           wanted: Callable[[Announcement], bool] | None = None) -> list:
    """The RolloutGroups a "rollout" envelope carries or announces (one, or a batch's), less those refused or not
    wanted; each item of a batch is received, and refused, on its own.

    Refusals are logged, reported as `refused(reason)` and, when the sender lied, scored against it in gossip.
    A group's worker must be the envelope's sender (nobody may publish or announce another worker's group).
    `wanted(announcement)` False skips the fetch (a validator the group is not assigned to): the blob is a
    worker's upload, paid once per receiver, so only receivers that will use it ask for it.
    """
    sender = env.sender_peer_id
    message = getattr(env, "message", None)
    if message is not None and hasattr(message, "items"):
        items = list(message.items)  # decoded and checked by gossip's validator (swarm.messages.gossip_bodies)
    else:
        try:
            items = [_without_traceback(item) for item in parse_items(env.body, limits)]
        except RolloutRefused as exc:
            _refuse(node, sender, _without_traceback(exc), refused)
            return []
    groups = []
    unserved = [False]  # a fetch of this envelope went unserved: the sender's other blobs are not waited for
    for item in items:
        if unserved[0] and isinstance(item, Announcement):
            _refuse(node, sender, RolloutRefused("unserved", "an earlier blob of the same batch went unserved",
                                                 hostile=False), refused, score=False)
            continue
        group = await _receive_item(node, sender, item, refused, limits, fetch, wanted, unserved)
        if group is not None:
            groups.append(group)
    return groups


def items_or_refusal(body: object, limits: TransportLimits = DEFAULT_LIMITS,
                     spend: Callable[[int], bool] | None = None) -> tuple[list, RolloutRefused | None]:
    """(the items of a rollout body, None), or ([], the refusal) for the first item refused (none after it is
    inflated) or the body as a whole; `spend` is the node-wide inflation allowance
    (swarm.messages.rollout_codec.parse_items_strictly).

    Why not raise: a refusal raised while inflating a compressed group carries a traceback whose frames hold the
    inflated buffer (up to the body's inflated bound would stay alive that way); the refusal comes back without
    it, and every reference to the parsed items goes with it."""
    try:
        return [_without_traceback(item) for item in parse_items_strictly(body, limits, spend)], None
    except RolloutRefused as exc:
        return [], _without_traceback(exc)


Item = TypeVar("Item")


def _without_traceback(exc: Item) -> Item:
    """The refusal with its traceback (and the frames, and their buffers) dropped; other items unchanged."""
    if isinstance(exc, BaseException):
        exc.__traceback__ = None
        exc.__context__ = exc.__cause__ = None
    return exc


async def _receive_item(node: PeerNetwork, sender: str, item: RolloutGroup | Announcement | RolloutRefused,
                        refused: Callable[[str], None] | None, limits: TransportLimits, fetch: FetchConfig,
                        wanted: Callable[[Announcement], bool] | None,
                        unserved: list[bool] | None = None) -> RolloutGroup | None:
    """One parsed item of an envelope (a group, an announcement or its refusal) as a checked group, or None."""
    try:
        if isinstance(item, RolloutRefused):
            raise item
        if isinstance(item, Announcement):
            if item.worker != sender:
                raise RolloutRefused("worker is not the sender", "announced for another worker", hostile=False)
            if wanted is not None and not wanted(item):
                return None
            item = await fetch_group(node.host, sender, item, limits, fetch)
        if item.worker != sender:
            raise RolloutRefused("worker is not the sender", "a group of another worker", hostile=False)
        return item
    except RolloutRefused as exc:
        if exc.reason == "unserved" and unserved is not None:
            unserved[0] = True  # why: 64 unserved announcements in one batch held its receive slot for 40 minutes
        return _refuse(node, sender, _without_traceback(exc), refused)
    except Exception as exc:  # noqa: BLE001 - a bug or an unforeseen input must drop one rollout, never the peer
        log.warning("rollout from %s dropped: %s: %s", sender, type(exc).__name__, exc)
        return _refuse(node, sender, RolloutRefused("error", str(exc), hostile=False), refused)


def _refuse(node: PeerNetwork, sender: str, exc: RolloutRefused, refused: Callable[[str], None] | None,
            score: bool = True) -> None:
    """Log, score (a lie costs like a forged envelope, an unserved announcement less) and report one refusal."""
    log.info("refused a rollout from %s: %s (%s)", sender, exc, exc.reason)
    if score and (exc.hostile or exc.reason == "unserved"):
        _score_down(node, sender, LIE_REASON if exc.hostile else UNSERVED_REASON)
    if refused is not None:
        refused(exc.reason)
    return None


async def fetch_group(host: HostPort, peer: str, ann: Announcement, limits: TransportLimits = DEFAULT_LIMITS,
                      fetch: FetchConfig = DEFAULT_FETCH):
    """Fetch, verify and decode the announced group from `peer`; RolloutRefused when it lies or never serves."""
    last = "no attempt"
    deadline = trio.current_time() + fetch.timeout_for(ann.size)
    for attempt in range(fetch.attempts):
        if attempt:
            await trio.sleep(min(fetch.backoff_s * 2 ** (attempt - 1), max(0.0, deadline - trio.current_time())))
        left = deadline - trio.current_time()
        if left <= 0:
            break
        try:
            blob = await fetch_blob(host, peer, ann, left)
        except HostError as exc:
            last = str(exc)
            continue
        if blob is None:
            raise RolloutRefused("unserved", f"{peer} no longer holds the announced blob", hostile=False)
        return await trio.to_thread.run_sync(open_blob, blob, ann, limits)
    raise RolloutRefused("unserved", f"announced blob not fetched within {fetch.timeout_for(ann.size):.0f} s "
                         f"({fetch.attempts} tries at most): {last}", hostile=False)


async def fetch_blob(host: HostPort, peer: str, ann: Announcement, timeout: float) -> bytes | None:
    """The blob `ann` names, as `peer` sends it (unverified), or None if it does not hold it.

    HostError on a transport failure or when dialing, opening and reading together pass `timeout`; RolloutRefused
    when the peer offers another size than announced (read no further: the length is the first lie we can catch).
    """
    try:
        with trio.fail_after(timeout):
            await ensure_connected(host, peer, ann.addrs)  # gossip may have reached us through a relay
            stream = await host.new_stream(peer, PROTOCOL)
            try:
                blob = await _request(stream, peer, ann)
            except BaseException:
                await reset_quietly(stream)  # shielded and bounded: also runs when the deadline cancelled us
                raise
            with trio.move_on_after(1.0):
                await _close_quietly(stream)
            return blob
    except trio.TooSlowError:
        raise HostError(f"fetching a rollout blob from {peer} timed out after {timeout:.0f} s") from None
    except (HostError, RolloutRefused):
        raise
    except Exception as exc:  # noqa: BLE001 - py-libp2p raises resets and EOFs of many types: all are retried
        raise HostError(f"the rollout blob stream from {peer} failed ({type(exc).__name__})") from None


async def _close_quietly(stream: HostStream) -> None:
    try:
        await stream.close()
    except Exception:  # noqa: BLE001 - the blob is in hand; a stream the peer already reset does not matter
        log.debug("closing a rollout blob stream failed", exc_info=True)


async def _request(stream: HostStream, peer: str, ann: Announcement) -> bytes | None:
    await stream.write(ann.blob_id)
    (length,) = _LEN.unpack(await read_exactly(stream, _LEN.size, "rollout blob stream"))
    if length == 0:
        return None
    if length != ann.size:
        raise RolloutRefused("size_mismatch", f"{peer} offered {length} bytes for a {ann.size}-byte blob")
    return await read_exactly(stream, length, "rollout blob stream")


def _score_down(node: PeerNetwork, peer: str, reason: str) -> None:
    """Count a lie against the sender as gossip counts a bad envelope (bans past the threshold)."""
    gossip = getattr(node, "gossip", None)
    if gossip is None:
        return

    try:
        gossip.penalize(peer, reason)
    except Exception:  # noqa: BLE001 - scoring is best effort; a refused rollout is already dropped
        log.debug("could not score down %s", peer, exc_info=True)
