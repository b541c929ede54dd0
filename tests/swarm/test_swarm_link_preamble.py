"""The mirror's preamble: a typed head whose declared size is capped before the body is read, a body not kept for
a manifest already held, a node-wide read rate, and a node-wide cap on channels waiting for one."""

from __future__ import annotations

import pytest
import trio
import trio.testing

from p2p.budget import BudgetExhausted, ByteRate
from p2p.identity import Identity
from p2p.pieces.store import PieceStore
from swarm.policy import inbound_links
from swarm.policy.link_preamble import PREAMBLE_INLINE_MAX, Preamble, PreambleBreach, decode_head, read_body, read_head
from swarm.policy.mirror import PolicyMirror
from swarm.policy.trust import TrainerTrust

ROUTE = bytes(range(32))
KIB = 1024


def head(size: int) -> bytes:
    return ROUTE + size.to_bytes(4, "big")


def test_a_head_declaring_more_than_a_preamble_carries_is_a_breach_before_a_byte_of_it_is_read():
    assert decode_head(head(PREAMBLE_INLINE_MAX)).signed_size == PREAMBLE_INLINE_MAX
    with pytest.raises(PreambleBreach, match="at most 65536"):
        decode_head(head(PREAMBLE_INLINE_MAX + 1))
    with pytest.raises(PreambleBreach):
        decode_head(head(1)[:-1])


async def test_an_unknown_manifest_is_returned_whole(autojump_clock):
    ours, theirs = trio.testing.memory_stream_pair()
    body = bytes(range(256)) * 256
    await theirs.send_all(head(len(body)) + body)
    parsed = await read_head(ours, 1.0)
    assert await read_body(ours, parsed, 1.0, known=lambda route: False) == Preamble(ROUTE, body)


async def test_a_known_manifest_is_read_and_dropped_not_returned(autojump_clock):
    ours, theirs = trio.testing.memory_stream_pair()
    await theirs.send_all(head(60_000) + bytes(60_000) + b"next")
    parsed = await read_head(ours, 1.0)
    assert await read_body(ours, parsed, 1.0, known=lambda route: True) == Preamble(ROUTE, b"")
    assert await ours.receive_some(4) == b"next"  # exactly the body was consumed


async def test_a_stalled_body_ends_at_its_timeout(autojump_clock):
    ours, theirs = trio.testing.memory_stream_pair()
    await theirs.send_all(head(60_000) + bytes(50_000))  # short of the end, then silence
    parsed = await read_head(ours, 1.0)
    assert await read_body(ours, parsed, 10.0, known=lambda route: False) is None
    assert trio.current_time() == pytest.approx(10.0)


class CountingStream:
    """A stream that counts the bytes read from it: what the node decrypted of a channel."""

    def __init__(self, stream) -> None:
        self.stream, self.read = stream, 0

    async def receive_some(self, max_bytes):
        data = await self.stream.receive_some(max_bytes)
        self.read += len(data)
        return data


async def test_preambles_of_any_number_of_channels_are_read_no_faster_than_the_node_rate(autojump_clock):
    """Ten identities sending preambles of manifests we hold (dropped as read, so nothing but the rate stops them)
    get one burst read; the rest are refused before a byte of their body is read; a later channel is served."""
    rate = ByteRate(rate=16 * KIB, burst=64 * KIB, max_wait=1.0)
    channels, refused = [], []

    async def channel():
        ours, theirs = trio.testing.memory_stream_pair()
        counted = CountingStream(ours)
        channels.append(counted)
        await theirs.send_all(head(64 * KIB) + bytes(64 * KIB))
        parsed = await read_head(counted, 1.0)
        try:
            assert await read_body(counted, parsed, 10.0, lambda route: True, rate) is not None
        except BudgetExhausted:
            refused.append(counted)

    async with trio.open_nursery() as nursery:
        for _ in range(10):
            nursery.start_soon(channel)
    assert len(refused) == 9 and all(c.read == len(head(0)) for c in refused)
    assert sum(c.read for c in channels) == 10 * len(head(0)) + 64 * KIB
    await trio.sleep(4.0)  # the rate refills: the next channel is read in full
    await channel()
    assert len(refused) == 9 and channels[-1].read == len(head(0)) + 64 * KIB


def _mirror(tmp_path, store):
    key = Identity.generate()
    return PolicyMirror(store, "m", TrainerTrust("r", key.public_bytes, tmp_path), run="r",
                        copies_dir=tmp_path / "policies")


async def test_a_breach_of_the_preamble_bans_its_sender(tmp_path, autojump_clock):
    with PieceStore(tmp_path / "store") as store:
        mirror = _mirror(tmp_path, store)
        async with trio.open_nursery() as nursery:
            await nursery.start(mirror.run_service)
            ours, theirs = trio.testing.memory_stream_pair()
            await theirs.send_all(head(PREAMBLE_INLINE_MAX + 1))
            await mirror.accept_link("liar", ours)
            assert "preamble" in mirror.banned["liar"]
            nursery.cancel_scope.cancel()


async def test_idle_channels_of_strangers_make_room_for_new_ones_when_the_node_wide_cap_is_reached(
        tmp_path, autojump_clock, monkeypatch):
    """Identities are free: past MAX_WAITING waiting channels, the oldest one still silent is ended."""
    monkeypatch.setattr(inbound_links, "MAX_WAITING", 3)
    with PieceStore(tmp_path / "store") as store:
        mirror = _mirror(tmp_path, store)
        ended = []
        async with trio.open_nursery() as nursery:
            await nursery.start(mirror.run_service)

            async def stranger(name):
                ours, _theirs = trio.testing.memory_stream_pair()
                await mirror.accept_link(name, ours)
                ended.append((name, trio.current_time()))

            for i in range(3):
                nursery.start_soon(stranger, f"s{i}")
                await trio.sleep(1.0)
            assert sum(mirror.inbound._waiting.values()) == 3 and not ended
            nursery.start_soon(stranger, "s3")
            await trio.sleep(1.0)
            assert [name for name, _ in ended] == ["s0"]  # the oldest silent one made room
            assert sum(mirror.inbound._waiting.values()) == 3
            nursery.cancel_scope.cancel()
