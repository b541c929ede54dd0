"""Every connection this peer opens waits its turn on one node-wide pace, however many identities name addresses."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import trio
from libp2p.network.exceptions import SwarmException

from p2p.host.dial_pacing import DIAL_BURST, DIALS_PER_S, MAX_DIAL_WAIT_S, DialPacer, pace_dials


def test_a_burst_goes_at_once_then_dials_take_turns_and_past_the_longest_wait_they_fail():
    pacer = DialPacer(rate=4.0, burst=3, max_wait=1.0)
    assert [pacer.delay(0.0) for _ in range(3)] == [0.0, 0.0, 0.0]
    assert [pacer.delay(0.0) for _ in range(4)] == [0.25, 0.5, 0.75, 1.0]
    assert pacer.delay(0.0) is None and pacer.refused == 1  # a refusal takes no turn
    assert pacer.delay(10.0) == 0.0  # quiet for a while: the burst is back


def test_a_pace_needs_sense():
    with pytest.raises(ValueError):
        DialPacer(rate=0)


async def test_a_crowd_naming_addresses_gets_the_node_wide_pace_in_all(autojump_clock):
    """1,000 peers' claims (identify, DHT answers, announcements) asking for dials all at once: over ten seconds
    the swarm opens the burst and then the pace, and the rest fail fast instead of queueing."""
    opened: list[float] = []

    async def dial_once(addr, peer_id, source=None):
        opened.append(trio.current_time())
        return SimpleNamespace(addr=addr)

    network = SimpleNamespace(_dial_addr_single_attempt=dial_once)
    pace_dials(SimpleNamespace(get_network=lambda: network), DialPacer())
    refused = 0

    async def dial(i: int) -> None:
        nonlocal refused
        try:
            await network._dial_addr_single_attempt(f"/ip4/203.0.113.{i % 250}/tcp/{1000 + i}", f"id{i}")
        except SwarmException:
            refused += 1

    start = trio.current_time()
    async with trio.open_nursery() as nursery:
        for second in range(10):
            for i in range(100):
                nursery.start_soon(dial, 100 * second + i)
            await trio.sleep(1)
    assert len(opened) + refused == 1000
    assert len(opened) <= DIAL_BURST + DIALS_PER_S * (10 + MAX_DIAL_WAIT_S)
    assert all(t - start <= 10 + MAX_DIAL_WAIT_S for t in opened)


def test_a_host_paces_its_dials():
    from p2p.host.p2p_host import build_libp2p_host
    from p2p.identity import Identity

    host = build_libp2p_host(Identity(bytes(range(32))), ["/ip4/127.0.0.1/tcp/0"])
    assert isinstance(host.get_network()._dial_addr_single_attempt.pacer, DialPacer)
