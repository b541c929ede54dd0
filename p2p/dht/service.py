"""Kademlia over py-libp2p's kad_dht: provider records for file roots and manifest ids, and a signed record that
names a run's latest manifest.

Why not simply run py-libp2p's KadDHT service (docs/reference.md#py-libp2p-pitfalls and its source, 0.8.1):
- its maintenance loop refreshes the routing table with one network lookup per non-empty bucket (each dialing up to
  ten peers a round, twenty rounds) and re-provides only every 22 h: we run our own loop instead, with ONE bounded
  lookup per refresh and a configurable re-provide interval (the DHT forgets otherwise, and new peers never learn);
- `find_providers` and `get_value` answer from the local store when it holds anything, so a peer that once saw
  the originator (or itself) as provider, or an old manifest version, never asks the network again: we always ask
  the network, merge with the local store, drop duplicates and ourselves;
- receivers rate-limit ADD_PROVIDER to 10 per 10 s per sender: our provides are paced below that;
- its stream handler is unguarded: we re-install it behind the host's guard.

The lookup itself is `traverse` (p2p.dht.lookup), a plain async function over an injected `ask(peer)` callable, so
its bounds (queries, concurrency, its end) are tested on an in-memory network of thousands of peers.

The latest-manifest record is self-certifying: its DHT key is derived from the run name AND the trainer's public
key, the value carries that key and the trainer's Ed25519 signature, and our namespace validator (with
`strict_validation=True`, so un-namespaced keys are refused too) rejects, on put and on get, any record whose
signature, key derivation or size is wrong. Among valid records the highest version wins.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import TypeVar

import blake3
import msgpack
import trio
from libp2p.kad_dht.common import PROTOCOL_ID
from libp2p.kad_dht.kad_dht import DHTMode, KadDHT
from libp2p.peer.id import ID
from libp2p.peer.peerinfo import PeerInfo
from libp2p.records.validator import NamespacedValidator, Validator

from p2p.dht.lookup import traverse, xor_rank
from p2p.errors import DHTError
from p2p.gossip.service import PublishPacer
from p2p.host.p2p_host import P2PHost
from p2p.identity import Identity

log = logging.getLogger(__name__)

NAMESPACE = "rlswarm"
RECORD_DOMAIN = b"rlswarm/latest-manifest/v1\x00"
MAX_RECORD_BYTES = 1024
T = TypeVar("T")


@dataclass(frozen=True)
class DHTConfig:
    """DHT behaviour. Times are seconds of trio time."""

    reprovide_interval_s: float = 600.0
    """How often every provided key and our latest-manifest record are announced again."""
    refresh_interval_s: float = 300.0
    """How often the routing table is refreshed (one bounded lookup of our own id)."""
    lookup_timeout_s: float = 10.0
    """Bound on one provide, put, find or get (partial results are returned when it runs out)."""
    max_queries: int = 40
    """Most peers one lookup may ask (the dial budget of a lookup)."""
    concurrency: int = 3
    """Peers asked in parallel by one lookup."""
    max_providers: int = 20
    """Most providers returned by `find_providers`."""
    value_quorum: int = 3
    """`get_latest_manifest` stops after this many valid answers."""
    provide_burst: int = 9
    """Provides per `provide_window_s` (receivers drop ADD_PROVIDER beyond 10 per 10 s per sender)."""
    provide_window_s: float = 10.0

    def __post_init__(self) -> None:
        numbers = (self.reprovide_interval_s, self.refresh_interval_s, self.lookup_timeout_s, self.max_queries,
                   self.concurrency, self.max_providers, self.value_quorum, self.provide_burst, self.provide_window_s)
        if min(numbers) <= 0:
            raise DHTError("every DHT interval, timeout and bound must be positive")


# ---- the latest-manifest record (pure) -------------------------------------------------------------------------


def latest_manifest_key(run: str, trainer_key: bytes) -> str:
    """The DHT key of a run's latest-manifest record: bound to the run name and to the trainer key."""
    digest = blake3.blake3(msgpack.packb([run, bytes(trainer_key)], use_bin_type=True)).hexdigest()
    return f"/{NAMESPACE}/{digest}"


@dataclass(frozen=True)
class LatestManifest:
    """Names a run's newest policy manifest; only the run's trainer key can produce a valid one."""

    run: str
    """Run name."""
    manifest_id: bytes
    """BLAKE3 id of the manifest (32 bytes)."""
    version: int
    """Policy version; the highest valid version wins."""
    trainer_key: bytes
    """The trainer's raw Ed25519 public key (32 bytes)."""
    sig: bytes
    """Trainer signature over RECORD_DOMAIN + msgpack([run, manifest_id, version, trainer_key])."""

    @property
    def key(self) -> str:
        return latest_manifest_key(self.run, self.trainer_key)

    @classmethod
    def sign(cls, run: str, manifest_id: bytes, version: int, trainer: Identity) -> LatestManifest:
        if len(manifest_id) != 32 or version < 0:
            raise DHTError("a latest-manifest record needs a 32-byte manifest id and a non-negative version")
        key = trainer.public_bytes
        return cls(run, bytes(manifest_id), version, key, trainer.sign(_record_payload(run, manifest_id, version, key)))

    def encode(self) -> bytes:
        return msgpack.packb([self.run, self.manifest_id, self.version, self.trainer_key, self.sig], use_bin_type=True)

    @classmethod
    def decode(cls, data: bytes, key: str | None = None) -> LatestManifest:
        """Parse and verify a record (and, given `key`, that it belongs under that DHT key); DHTError otherwise."""
        record = _parse_record(data)
        if not Identity.verify(record.trainer_key, _record_payload(*_fields(record)), record.sig):
            raise DHTError("latest-manifest record is not signed by the trainer key it names")
        if key is not None and record.key != key:
            raise DHTError("latest-manifest record does not belong under this DHT key (wrong run or trainer)")
        return record


def _fields(record: LatestManifest) -> tuple[str, bytes, int, bytes]:
    return record.run, record.manifest_id, record.version, record.trainer_key


def _record_payload(run: str, manifest_id: bytes, version: int, trainer_key: bytes) -> bytes:
    return RECORD_DOMAIN + msgpack.packb([run, bytes(manifest_id), version, bytes(trainer_key)], use_bin_type=True)


def _parse_record(data: bytes) -> LatestManifest:
    if not isinstance(data, (bytes, bytearray)) or len(data) > MAX_RECORD_BYTES:
        raise DHTError("latest-manifest record is not bytes or exceeds 1 KiB")
    try:
        run, manifest_id, version, trainer_key, sig = msgpack.unpackb(bytes(data), raw=False)
    except Exception:  # noqa: BLE001 - hostile bytes: any decoding failure is the same refusal
        raise DHTError("latest-manifest record is not a 5-item msgpack array") from None
    ok = (isinstance(run, str) and isinstance(manifest_id, bytes) and len(manifest_id) == 32
          and type(version) is int and version >= 0 and isinstance(trainer_key, bytes) and len(trainer_key) == 32
          and isinstance(sig, bytes) and len(sig) == 64)
    if not ok:
        raise DHTError("latest-manifest record has a field of the wrong type or size")
    return LatestManifest(run, manifest_id, version, trainer_key, sig)


def best_record(records: Sequence[LatestManifest]) -> LatestManifest | None:
    """Highest version wins; equal versions are broken by manifest id so every peer picks the same one."""
    return max(records, key=lambda r: (r.version, r.manifest_id), default=None)


class LatestManifestValidator(Validator):
    """Our namespace's validator in py-libp2p's interface: a record is kept only if it decodes, and of several the
    highest version wins (ties broken by manifest id, as `best_record` does)."""

    def validate(self, key: str, value: bytes) -> None:
        LatestManifest.decode(value, key)

    def select(self, key: str, values: list[bytes]) -> int:
        ranked = []
        for index, value in enumerate(values):
            try:
                record = LatestManifest.decode(value, key)
            except DHTError:
                continue
            ranked.append(((record.version, record.manifest_id), index))
        if not ranked:
            raise DHTError("no valid latest-manifest record to select from")
        return max(ranked)[1]


def _record_validator() -> LatestManifestValidator:
    return LatestManifestValidator()


# ---- the libp2p adapter ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Provider:
    """A peer that announced it holds a key."""

    peer_id: str
    """libp2p peer id."""
    multiaddrs: tuple[str, ...]
    """Its announced addresses, each ending in /p2p/<peer id> (ready for P2PHost.connect)."""


class DHT:
    """A running DHT node. Build it with `open_dht`."""

    def __init__(self, host: P2PHost, kad: KadDHT, config: DHTConfig) -> None:
        self.host = host
        self.kad = kad
        self.config = config
        self._me = host.libp2p.get_id()
        self._provided: dict[bytes, None] = {}
        self._records: dict[str, LatestManifest] = {}
        self._pacer = PublishPacer(config.provide_burst, config.provide_window_s)

    async def provide(self, key: bytes) -> bool:
        """Announce that we hold `key` (a file root or manifest id) now and at every re-provide; True if the
        announcement went out to at least one peer within the lookup timeout (ADD_PROVIDER has no reply)."""
        self._provided[bytes(key)] = None
        return await self._announce(bytes(key))

    def unprovide(self, key: bytes) -> None:
        """Stop re-announcing `key` (e.g. a garbage-collected version); existing records expire on their own."""
        self._provided.pop(bytes(key), None)

    @property
    def provided(self) -> list[bytes]:
        return list(self._provided)

    async def find_providers(self, key: bytes) -> list[Provider]:
        """Peers that announced `key`: local records merged with a bounded network lookup, duplicates and
        ourselves removed, at most `max_providers`; whatever was found when the lookup timeout ran out."""
        key = bytes(key)
        found: list[PeerInfo] = list(self.kad.provider_store.get_providers(key))
        found += await self._lookup(
            key, lambda peer: self.kad.provider_store._get_providers_from_peer_with_closers(peer, key),
            enough=lambda items: len(_unique(found + items, self._me)) >= self.config.max_providers,
        )
        return [_provider(info) for info in _unique(found, self._me)[: self.config.max_providers]]

    async def put_latest_manifest(self, record: LatestManifest) -> None:
        """Store the run's latest-manifest record (and keep re-publishing it); DHTError if it does not verify or
        a newer version is already known here (putting the same record again is fine)."""
        LatestManifest.decode(record.encode(), record.key)
        best = self._best_known(record)
        if best != record:
            raise DHTError(f"version {record.version} is not newer than the known version {best.version}")
        self._records[record.key] = record
        await self._put(record)

    def _best_known(self, record: LatestManifest) -> LatestManifest:
        """The best of `record`, our own latest put under its key, and the valid one in the local store."""
        local = self.kad.value_store.get(record.key.encode())
        known = _valid_records([local.value] if local else [], record.key)
        known += [self._records[record.key]] if record.key in self._records else []
        return best_record([*known, record])

    async def get_latest_manifest(self, run: str, trainer_key: bytes) -> LatestManifest | None:
        """The newest valid record for `run` signed by `trainer_key`, asking the network every time (a newer
        version may have appeared); None if nobody has one. Forged records are ignored."""
        key = latest_manifest_key(run, trainer_key)
        key_bytes = key.encode()
        values = [rec.value] if (rec := self.kad.value_store.get(key_bytes)) is not None else []

        async def ask(peer: ID) -> tuple[list[bytes], list[ID]]:
            got, closer = await self.kad.value_store._get_from_peer(peer, key_bytes, True, True)
            return ([got.value] if got is not None else []), closer

        values += await self._lookup(key_bytes, ask, enough=lambda items: len(items) >= self.config.value_quorum)
        best = best_record(_valid_records(values, key))
        if best is not None and (rec is None or rec.value != best.encode()):
            self.kad.value_store.put(key_bytes, best.encode())  # serve the newest version from now on
        return best

    async def refresh(self) -> None:
        """Seed the routing table with our connections, then ONE lookup of our own id (py-libp2p adds every peer
        it hears of to the routing table), within the lookup's query budget and timeout."""
        for peer in self.host.libp2p.get_connected_peers():
            try:
                await self.kad.routing_table.add_peer(peer, skip_server_mode_check=True)
            except Exception:  # noqa: BLE001 - a peer that vanished meanwhile is simply not added
                log.debug("cannot add %s to the routing table", peer, exc_info=True)
        await self._closest(self._me.to_bytes())

    async def reprovide(self) -> None:
        """Announce every provided key and re-put every latest-manifest record we own."""
        for key in list(self._provided):
            await self._announce(key)
        for key, record in list(self._records.items()):
            if self._best_known(record) != record:  # someone (a restarted trainer?) put a newer version
                del self._records[key]
                continue
            await self._put(record)

    async def _announce(self, key: bytes) -> bool:
        while (wait := self._pacer.delay("provide", trio.current_time())) > 0:
            await trio.sleep(wait)
        self._pacer.record("provide", trio.current_time())
        self.kad.provider_store.add_provider(key, PeerInfo(self._me, self.host.libp2p.get_addrs()))
        sent = await self._send_to_closest(key, lambda peer: self.kad.provider_store._send_add_provider(peer, key))
        if not sent:
            log.info("nobody took the provider record for %s yet; it is re-sent at the next re-provide", key.hex()[:16])
        return sent > 0

    async def _put(self, record: LatestManifest) -> None:
        key_bytes, value = record.key.encode(), record.encode()
        self.kad.value_store.put(key_bytes, value)
        await self._send_to_closest(key_bytes, lambda peer: self.kad.value_store._store_at_peer(peer, key_bytes, value))

    async def _send_to_closest(self, key: bytes, send: Callable[[ID], Awaitable[bool]]) -> int:
        """Run `send(peer)` on the peers closest to `key`, `concurrency` at a time, each within the timeout;
        returns how many succeeded."""
        limiter, sent = trio.CapacityLimiter(self.config.concurrency), [0]

        async def send_one(peer: ID) -> None:
            async with limiter:
                with trio.move_on_after(self.config.lookup_timeout_s):
                    try:
                        sent[0] += bool(await send(peer))
                    except Exception:  # noqa: BLE001 - one unreachable peer must not stop the others
                        log.debug("sending to %s failed", peer, exc_info=True)

        closest = await self._closest(key)
        async with trio.open_nursery() as nursery:
            for peer in closest:
                nursery.start_soon(send_one, peer)
        return sent[0]

    async def _closest(self, key: bytes, count: int = 20) -> list[ID]:
        """The `count` peers closest to `key` that we asked during one bounded lookup (our dial budget)."""
        async def ask(peer: ID) -> tuple[list[ID], list[ID]]:
            return [peer], await self.kad.peer_routing._query_peer_for_closest(peer, key)

        asked = await self._lookup(key, ask, enough=lambda items: False, closest=count)
        return sorted(set(asked), key=xor_rank(key))[:count]

    async def _lookup(self, key: bytes, ask: Callable[[ID], Awaitable[tuple[list[T], list[ID]]]],
                      enough: Callable[[list[T]], bool], closest: int = 0) -> list[T]:
        near = self.kad.routing_table.find_local_closest_peers(key, 20)
        start = list(dict.fromkeys([*near, *self.host.libp2p.get_connected_peers()]))
        return await traverse(
            start, ask, enough=enough, max_queries=self.config.max_queries, concurrency=self.config.concurrency,
            rank=xor_rank(key), skip={self._me}, timeout=self.config.lookup_timeout_s, closest=closest,
        )

    async def _maintain(self) -> None:
        """Refresh at start and then every refresh interval; re-provide every re-provide interval."""
        await self.refresh()
        next_refresh = trio.current_time() + self.config.refresh_interval_s
        next_provide = trio.current_time() + self.config.reprovide_interval_s
        while True:
            await trio.sleep_until(min(next_refresh, next_provide))
            now = trio.current_time()
            if now >= next_refresh:
                await self.refresh()
                next_refresh = now + self.config.refresh_interval_s
            if now >= next_provide:
                await self.reprovide()
                next_provide = now + self.config.reprovide_interval_s


def _unique(infos: Sequence[PeerInfo], me: ID) -> list[PeerInfo]:
    """One entry per peer id (the first seen, merging nothing), never ourselves."""
    seen: dict[ID, PeerInfo] = {}
    for info in infos:
        if info.peer_id != me and info.peer_id not in seen:
            seen[info.peer_id] = info
    return list(seen.values())


def _provider(info: PeerInfo) -> Provider:
    suffix = f"/p2p/{info.peer_id}"
    addrs = (str(a) for a in info.addrs)
    return Provider(str(info.peer_id), tuple(a if a.endswith(suffix) else a + suffix for a in addrs))


def _valid_records(values: Sequence[bytes], key: str) -> list[LatestManifest]:
    records = []
    for value in values:
        try:
            records.append(LatestManifest.decode(value, key))
        except DHTError:
            log.info("ignored an invalid latest-manifest record under %s", key)
    return records


@asynccontextmanager
async def open_dht(host: P2PHost, config: DHTConfig | None = None) -> AsyncIterator[DHT]:
    """Run a Kademlia node (server mode) on a started host (p2p.host.p2p_host.P2PHost), bootstrapped from the peers the
    host is connected to; maintenance (refresh, re-provide) runs until the context exits."""
    validator = NamespacedValidator({NAMESPACE: _record_validator()}, strict_validation=True)
    kad = KadDHT(host.libp2p, DHTMode.SERVER, validator=validator, strict_validation=True)
    host.set_guarded_handler(PROTOCOL_ID, kad.handle_stream, timeout=30.0, idle_streams=True)
    dht = DHT(host, kad, config or DHTConfig())
    async with trio.open_nursery() as nursery:
        nursery.start_soon(dht._maintain)
        try:
            yield dht
        finally:
            nursery.cancel_scope.cancel()
            host.remove_handler(PROTOCOL_ID)
