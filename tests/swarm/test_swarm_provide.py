"""A peer announces on the DHT the versions it mirrors: new ones once, dropped ones no more, and in a large run
only if it signed the version or is one of about DHT_PROVIDERS_WANTED peers drawn for it."""

from __future__ import annotations

import os
from types import SimpleNamespace

import pytest
import trio

from swarm.config import MirrorSection
from swarm.errors import UserError
from swarm.node.node import DHT_PROVIDERS_WANTED, _provide_held, held_keys, provides_key


def policy(version: int, task_root: bytes = b"task", origin: str = "trainer") -> SimpleNamespace:
    files = (SimpleNamespace(root=b"weights-%d" % version), SimpleNamespace(root=task_root))
    return SimpleNamespace(manifest=SimpleNamespace(id=b"manifest-%d" % version, files=files), origin=origin)


CONFIG = SimpleNamespace(mirror=MirrorSection())


class FakeMirror:
    def __init__(self) -> None:
        self.policies: dict[int, SimpleNamespace] = {}
        self.changed = trio.Event()

    def set(self, *versions: int, origin: str = "trainer") -> None:
        self.policies = {v: policy(v, origin=origin) for v in versions}
        self.changed.set()
        self.changed = trio.Event()


class FakeDHT:
    def __init__(self) -> None:
        self.announced: list[bytes] = []
        self.provided: set[bytes] = set()  # what the DHT would re-announce at each re-provide

    async def provide(self, key: bytes) -> bool:
        await trio.sleep(1)  # an announcement takes a lookup; versions may change meanwhile
        self.announced.append(key)
        self.provided.add(key)
        return True

    def unprovide(self, key: bytes) -> None:
        self.provided.discard(key)


def test_held_keys_are_the_manifest_ids_once_each():
    assert held_keys([policy(1), policy(2), policy(2)]) == [b"manifest-1", b"manifest-2"]


async def test_dropped_versions_are_no_longer_reprovided(autojump_clock):
    mirror, dht = FakeMirror(), FakeDHT()
    node = SimpleNamespace(mirror=mirror, dht=dht, peer_id="seed", peer_heard={}, config=CONFIG)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_provide_held, node)
        mirror.set(1)
        await trio.sleep(10)
        mirror.set(1, 2)
        await trio.sleep(0.5)  # version 2 is being announced ...
        mirror.set(2, 3)  # ... when version 1 is dropped and version 3 arrives
        await trio.sleep(10)
        nursery.cancel_scope.cancel()
    assert dht.provided == {b"manifest-2", b"manifest-3"}
    assert sorted(dht.announced) == sorted(set(dht.announced))  # each key announced once


def test_small_runs_provide_everything_and_large_ones_about_the_wanted_number_of_peers():
    keys = [os.urandom(32) for _ in range(200)]
    assert all(provides_key(key, os.urandom(16), DHT_PROVIDERS_WANTED - 1) for key in keys)
    for known in (99, 999):
        draws = 20_000
        providing = sum(provides_key(os.urandom(32), os.urandom(16), known) for _ in range(draws))
        expected = draws * DHT_PROVIDERS_WANTED / (known + 1)  # about DHT_PROVIDERS_WANTED of the known + 1 peers
        assert 0.8 * expected <= providing <= 1.2 * expected


def test_the_draw_is_each_peers_own_and_stable_for_a_key():
    key = os.urandom(32)
    salts = [os.urandom(16) for _ in range(2000)]
    chosen = [salt for salt in salts if provides_key(key, salt, 999)]
    assert 15 <= len(chosen) <= 70  # about 2 % of the peers, not all or none
    assert all(provides_key(key, salt, 999) for salt in chosen)  # asked again, the same answer


async def test_in_a_large_run_the_signer_provides_its_version_and_others_mostly_do_not(autojump_clock):
    crowd = {f"peer{i}": 0.0 for i in range(999)}
    providing = 0
    for peer in range(100):
        mirror, dht = FakeMirror(), FakeDHT()
        node = SimpleNamespace(mirror=mirror, dht=dht, peer_id=f"peer{peer}", peer_heard=crowd, config=CONFIG)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_provide_held, node)
            await trio.sleep(0)
            mirror.set(1)
            await trio.sleep(5)
            nursery.cancel_scope.cancel()
        providing += bool(dht.announced)
    assert providing <= 10  # about 2 of 100 peers
    mirror, dht = FakeMirror(), FakeDHT()
    node = SimpleNamespace(mirror=mirror, dht=dht, peer_id="trainer", peer_heard=crowd, config=CONFIG)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_provide_held, node)
        await trio.sleep(0)
        mirror.set(1, 2, origin="trainer")
        await trio.sleep(5)
        nursery.cancel_scope.cancel()
    assert dht.announced == [b"manifest-1", b"manifest-2"]


def test_the_wanted_number_is_the_mirror_setting_and_scales_the_draw():
    assert MirrorSection().dht_providers == DHT_PROVIDERS_WANTED
    draws, known = 20_000, 16
    providing = sum(provides_key(os.urandom(32), os.urandom(16), known, 0.34) for _ in range(draws))
    assert 0.8 * draws * 0.02 <= providing <= 1.2 * draws * 0.02  # 0.34 / 17: the rate of a 1,000-peer run
    with pytest.raises(UserError):
        MirrorSection(dht_providers=-1)
