"""Conformance: the piece protocol completes a swarm over every stream implementation, not only memnet.

Real loopback sockets carry the bytes here (B's encrypted record channel over a socketpair, and raw trio socket
streams), so this runs on the real clock; it is small (1 MB) and waits on completion events, never on sleeps.
"""

from __future__ import annotations

import random

import pytest
import trio

from p2p.channel.records import DIALER, LISTENER, RecordOpener, RecordSealer
from p2p.channel.stream import SecureChannelStream
from p2p.pieces.store import PieceStore
from p2p.pieces.transfer import SwarmService
from tests.p2p.test_p2p_transfer import MB, make_policy

KEY = bytes(range(32))


def socket_pair():
    a, b = trio.socket.socketpair()
    return trio.SocketStream(a), trio.SocketStream(b)


def secure_pair():
    a, b = socket_pair()
    left = SecureChannelStream(a, RecordSealer(KEY, DIALER), RecordOpener(KEY, LISTENER), "right")
    right = SecureChannelStream(b, RecordSealer(KEY, LISTENER), RecordOpener(KEY, DIALER), "left")
    return left, right


@pytest.mark.parametrize("make_pair", [socket_pair, secure_pair], ids=["trio-socket", "secure-channel"])
async def test_swarm_completes_over_real_streams(tmp_path, make_pair):
    manifest = make_policy(tmp_path / "src", 1 * MB)
    names = ["seed", "p0", "p1"]
    stores = {n: PieceStore(tmp_path / n) for n in names}
    stores["seed"].add_local_policy(manifest, tmp_path / "src")
    services = {n: SwarmService(manifest, stores[n], rng=random.Random(n)) for n in names}
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            for s in services.values():
                await nursery.start(s.run)
            for i, a in enumerate(names):
                for b in names[i + 1 :]:
                    sa, sb = make_pair()
                    services[a].add_link(b, sa)
                    services[b].add_link(a, sb)
            await services["p0"].completed.wait()
            await services["p1"].completed.wait()
            nursery.cancel_scope.cancel()
    for n in ("p0", "p1"):
        out = stores[n].reassemble(manifest, tmp_path / "out" / n)
        assert all((out / f.name).read_bytes() == (tmp_path / "src" / f.name).read_bytes() for f in manifest.files)
    for st in stores.values():
        st.close()
