"""A peer announces on the DHT exactly the versions it mirrors: new ones once, dropped ones no more."""

from __future__ import annotations

from types import SimpleNamespace

import trio

from swarm.node.node import _provide_held, held_keys


def policy(version: int, task_root: bytes = b"task") -> SimpleNamespace:
    files = (SimpleNamespace(root=b"weights-%d" % version), SimpleNamespace(root=task_root))
    return SimpleNamespace(manifest=SimpleNamespace(id=b"manifest-%d" % version, files=files))


class FakeMirror:
    def __init__(self) -> None:
        self.policies: dict[int, SimpleNamespace] = {}
        self.changed = trio.Event()

    def set(self, *versions: int) -> None:
        self.policies = {v: policy(v) for v in versions}
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


def test_held_keys_name_each_manifest_and_file_root_once():
    assert held_keys([policy(1), policy(2)]) == [b"manifest-1", b"weights-1", b"task", b"manifest-2", b"weights-2"]


async def test_dropped_versions_are_no_longer_reprovided_and_shared_roots_stay(autojump_clock):
    mirror, dht = FakeMirror(), FakeDHT()
    node = SimpleNamespace(mirror=mirror, dht=dht)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_provide_held, node)
        mirror.set(1)
        await trio.sleep(10)
        mirror.set(1, 2)
        await trio.sleep(0.5)  # version 2 is being announced ...
        mirror.set(2, 3)  # ... when version 1 is dropped and version 3 arrives
        await trio.sleep(10)
        nursery.cancel_scope.cancel()
    assert dht.provided == {b"manifest-2", b"weights-2", b"manifest-3", b"weights-3", b"task"}
    assert sorted(dht.announced) == sorted(set(dht.announced))  # each key announced once, the shared root too
