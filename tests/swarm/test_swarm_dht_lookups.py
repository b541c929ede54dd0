"""A peer asks the DHT for the run's latest manifest less often the longer the run stays quiet, and soon again once
a version arrives: lookups cost a dozen streams on as many peers, and an idle swarm asking every 20 s spent a third
of its CPU on them."""

from __future__ import annotations

from types import SimpleNamespace

import trio

from swarm.node import node as node_module
from swarm.node.node import DHT_QUIET_MAX_S, next_quiet_wait


class QuietMirror:
    def __init__(self) -> None:
        self.changed = trio.Event()
        self.trust = SimpleNamespace(key=b"trainer-key")
        self.newest = SimpleNamespace(version=1)

    def latest(self):
        return self.newest

    def new_version(self) -> None:
        self.newest = SimpleNamespace(version=self.newest.version + 1)
        self.changed.set()
        self.changed = trio.Event()


def test_the_wait_doubles_up_to_its_bound():
    assert next_quiet_wait(20.0, DHT_QUIET_MAX_S) == 40.0
    assert next_quiet_wait(300.0, DHT_QUIET_MAX_S) == DHT_QUIET_MAX_S


async def test_lookups_back_off_while_nothing_arrives_and_start_over_after_a_version(monkeypatch, autojump_clock):
    asked: list[float] = []
    mirror = QuietMirror()

    async def lookup(node) -> None:
        asked.append(trio.current_time())

    monkeypatch.setattr(node_module, "_adopt_latest_from_dht", lookup)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(node_module._find_latest_on_dht, SimpleNamespace(mirror=mirror))
        await trio.sleep(1000)
        mirror.new_version()
        await trio.sleep(70)
        nursery.cancel_scope.cancel()
    assert asked == [20, 60, 140, 300, 620, 940, 1020, 1060]


async def test_a_lookup_that_brings_a_version_keeps_the_short_wait(monkeypatch, autojump_clock):
    asked: list[float] = []
    mirror = QuietMirror()

    async def lookup(node) -> None:
        asked.append(trio.current_time())
        if len(asked) == 2:
            mirror.newest = SimpleNamespace(version=2)  # adopted from the DHT: no change event reaches the wait

    monkeypatch.setattr(node_module, "_adopt_latest_from_dht", lookup)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(node_module._find_latest_on_dht, SimpleNamespace(mirror=mirror))
        await trio.sleep(150)
        nursery.cancel_scope.cancel()
    assert asked == [20, 60, 80, 120]
