"""Yamux's background traffic on an idle connection between two real hosts (p2p.libp2p_compat.tune_yamux): its
round-trip pings go out once at the start and then every YAMUX_RTT_EVERY_S (minutes), not every 30 s as py-libp2p
sends them."""

from __future__ import annotations

import pytest
import trio
import trio.testing
from libp2p.stream_muxer.yamux import yamux

from p2p.host.p2p_host import open_host
from p2p.libp2p_compat import YAMUX_RTT_EVERY_S, tune_yamux


@pytest.fixture
def pings(monkeypatch) -> list[float]:
    """When each Yamux ping this test's hosts sent went out (trio time)."""
    sent: list[float] = []
    tune_yamux()  # what open_host does: installs its own frame writer once, which this one wraps
    original = yamux.Yamux._write_frame

    async def counted(self, header: bytes, *args, **kwargs):
        typ, flags = header[1], int.from_bytes(header[2:4], "big")
        if typ == yamux.TYPE_PING and flags & yamux.FLAG_SYN:
            sent.append(trio.current_time())
        return await original(self, header, *args, **kwargs)

    counted.lean = True  # type: ignore[attr-defined] - so open_host's tune_yamux keeps it
    monkeypatch.setattr(yamux.Yamux, "_write_frame", counted)
    return sent


@pytest.fixture
def settling_clock() -> trio.testing.MockClock:
    """Virtual time that jumps only after 5 ms of real idleness: loopback handshakes the kernel defers under load
    finish before a timeout's deadline comes."""
    return trio.testing.MockClock(autojump_threshold=0.005)


async def test_an_idle_connection_pings_once_then_only_every_few_minutes(pings, settling_clock):
    async with open_host() as server, open_host() as client:
        await client.connect(server.multiaddrs[0])
        start = trio.current_time()
        await trio.sleep(100.0)  # py-libp2p's own period would have pinged three more times from each end
        pings_seen = [round(t - start) for t in pings]
    assert YAMUX_RTT_EVERY_S > 100.0
    assert 1 <= len(pings_seen) <= 2 and all(t < 5 for t in pings_seen), pings_seen  # each end's first ping only
