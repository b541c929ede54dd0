"""Spare data channels live a drawn part of `spare_ttl` each, so spares dialed together are not renewed together;
a spare to a peer no longer connected gives up its place after a grace."""

from __future__ import annotations

import trio
import trio.testing

from p2p.identity import Identity
from p2p.pieces.store import PieceStore
from swarm.policy.mirror import PolicyMirror
from swarm.policy.spares import SPARE_ABSENT_GRACE, SPARE_TTL_SPREAD, spare_lifetime
from swarm.policy.trust import TrainerTrust


def test_a_spare_lives_between_three_quarters_of_the_ttl_and_the_ttl():
    assert spare_lifetime(240.0, draw=lambda: 0.0) == 240.0  # never past what the acceptor waits for
    assert spare_lifetime(240.0, draw=lambda: 1.0) == 240.0 * (1 - SPARE_TTL_SPREAD) == 180.0


async def test_spares_dialed_at_once_are_renewed_spread_over_the_last_quarter_of_their_ttl(tmp_path, autojump_clock):
    key = Identity.generate()
    neighbours = [f"peer-{i:02d}" for i in range(32)]
    dials: list[tuple[str, float]] = []

    async def dial(peer):
        dials.append((peer, trio.current_time()))
        return trio.testing.memory_stream_pair()[0]

    with PieceStore(tmp_path / "store", keep_versions=2) as store:
        mirror = PolicyMirror(store, "me", TrainerTrust("r", key.public_bytes, tmp_path), run="r", spare_ttl=240.0)
        async with trio.open_nursery() as nursery:
            await nursery.start(mirror.run_service)
            start = trio.current_time()
            mirror.spares.keep(neighbours, dial, max_links=32, now=start)  # a flash crowd's join: all at once
            await trio.sleep(1.0)
            assert len(mirror.spares._spares) == 32
            for _ in range(250):  # 250 s of reconcile rounds, one a second
                mirror.spares.keep(neighbours, dial, max_links=32, now=trio.current_time())
                await trio.sleep(1.0)
            nursery.cancel_scope.cancel()
    renewals = sorted(at - start for peer, at in dials[32:])
    assert len(renewals) == 32  # each spare renewed once in 250 s
    assert renewals[0] >= 180.0 and renewals[-1] <= 242.0
    assert len({int(at) for at in renewals}) >= 16  # spread over many seconds, not one burst of 32 dials


async def test_a_spare_outlives_its_peers_connection_only_by_the_grace(tmp_path, autojump_clock):
    key = Identity.generate()
    closed: list[str] = []

    class Channel(trio.abc.Stream):
        def __init__(self, peer: str) -> None:
            self.peer = peer

        async def aclose(self) -> None:
            closed.append(self.peer)

        async def send_all(self, data) -> None: ...
        async def wait_send_all_might_not_block(self) -> None: ...
        async def receive_some(self, max_bytes=None) -> bytes:
            return b""

    async def dial(peer):
        return Channel(peer)

    with PieceStore(tmp_path / "store", keep_versions=2) as store:
        mirror = PolicyMirror(store, "me", TrainerTrust("r", key.public_bytes, tmp_path), run="r")
        async with trio.open_nursery() as nursery:
            await nursery.start(mirror.run_service)
            mirror.spares.keep(["a", "b", "c"], dial, max_links=2, now=trio.current_time())
            await trio.sleep(1.0)
            assert set(mirror.spares._spares) == {"a", "b"}  # the places are full: no spare for c
            for second in range(int(SPARE_ABSENT_GRACE) + 5):
                listed = ["b", "c"] if second != 3 else ["c"]  # a left for good; b missed from one listing
                mirror.spares.keep(listed, dial, max_links=2, now=trio.current_time())
                await trio.sleep(1.0)
            nursery.cancel_scope.cancel()
    assert closed == ["a"] and set(mirror.spares._spares) == {"b", "c"}  # a's place went to c; b's spare stayed


async def test_spare_dials_to_a_refusing_peer_back_off_and_a_crowd_of_them_is_remembered_within_a_bound(
        autojump_clock):
    """Each failed spare dial doubles the pause before the next (up to SPARE_RETRY_MAX); identities are free, so
    the peers remembered as failing are at most MAX_FAILURES, the oldest forgotten first."""
    from swarm.policy.spares import MAX_FAILURES, SPARE_RETRY, SPARE_RETRY_MAX, SpareChannels

    spares = SpareChannels("me", ttl=600.0, dial_timeout=15.0, on_event=lambda event: None,
                           close=lambda stream: None, start_with=lambda *task: None)
    pauses = []
    for _ in range(6):
        spares.failed("refuser")
        pauses.append(spares._failures["refuser"][1])
    assert pauses == [SPARE_RETRY, 4.0, 8.0, 16.0, SPARE_RETRY_MAX, SPARE_RETRY_MAX]
    for i in range(MAX_FAILURES + 50):
        spares.failed(f"stranger-{i}")
    assert len(spares._failures) == MAX_FAILURES
    assert "refuser" not in spares._failures and "stranger-0" not in spares._failures
    assert f"stranger-{MAX_FAILURES + 49}" in spares._failures
    spares.failed("stranger-60")  # failing again makes it the newest, so it outlives older ones
    assert list(spares._failures)[-1] == "stranger-60"
