"""Yamux receive-window credit between two real hosts (p2p.libp2p_compat.grant_window_at_half): small messages
cost the reader no window-update frames until half the window has been read, and a sender that fills its whole
window still gets its credit, so bulk data keeps flowing."""

from __future__ import annotations

import os

import blake3
import pytest
import trio
from libp2p.network.stream.exceptions import StreamEOF
from libp2p.stream_muxer.yamux.yamux import DEFAULT_WINDOW_SIZE, YamuxStream

from p2p.host.p2p_host import open_host

PROTOCOL = "/test/window/1.0.0"


@pytest.fixture
def window_updates(monkeypatch):
    """Every WINDOW_UPDATE a Yamux stream sends in this test, as its credit in bytes."""
    sent: list[int] = []
    original = YamuxStream.send_window_update

    async def counted(self, increment, *args, **kwargs):
        sent.append(increment)
        return await original(self, increment, *args, **kwargs)

    monkeypatch.setattr(YamuxStream, "send_window_update", counted)
    return sent


async def transfer(messages: list[bytes], read_size: int, prelude=None) -> bytes:
    """Send `messages` on one stream between two hosts; the reader hashes what it reads, `read_size` at a time,
    after `prelude(stream, hasher)` when given."""
    received = blake3.blake3()
    done = trio.Event()

    async def reader(stream) -> None:
        if prelude is not None:
            await prelude(stream, received)
        try:
            while chunk := await stream.read(read_size):
                received.update(chunk)
        except StreamEOF:  # py-libp2p's end of a stream the writer closed
            pass
        done.set()

    async with open_host() as server, open_host() as client:
        server.set_guarded_handler(PROTOCOL, reader, timeout=None)
        await client.connect(server.multiaddrs[0])
        with trio.fail_after(30):
            stream = await client.new_stream(server.peer_id, PROTOCOL)
            for message in messages:
                await stream.write(message)
            await stream.close()
            await done.wait()
    return received.digest()


async def test_small_messages_read_one_by_one_send_no_window_update(window_updates):
    messages = [os.urandom(600) for _ in range(150)]  # 90 kB: under half the 256 KiB window
    digest = await transfer(messages, read_size=600)
    assert digest == blake3.blake3(b"".join(messages)).digest()
    assert window_updates == []  # py-libp2p's own rule grants credit at almost every read


async def test_a_sender_that_fills_the_window_gets_credit_and_bulk_flows(window_updates):
    data = os.urandom(8 * DEFAULT_WINDOW_SIZE + 123)  # eight windows: stalls for ever if credit is never granted
    digest = await transfer([data[i:i + 65_000] for i in range(0, len(data), 65_000)], read_size=4096)
    assert digest == blake3.blake3(data).digest()
    assert 0 < len(window_updates) <= 2 * len(data) // DEFAULT_WINDOW_SIZE  # a few per window, not one per read


async def test_a_sender_out_of_credit_gets_what_each_slow_read_frees(window_updates):
    """py-libp2p's writer resets a stream after 5 s without credit: a reader slower than half a window per 5 s must
    not wait for half a window before granting."""
    data = os.urandom(DEFAULT_WINDOW_SIZE + 64 * 1024)
    granted_before: list[int] = []
    granted_after_one_read: list[int] = []

    async def one_read_once_the_window_is_used(stream, received) -> None:
        buffers, stream_id = stream.muxed_stream.conn.stream_buffers, stream.muxed_stream.stream_id
        while len(buffers.get(stream_id, b"")) < DEFAULT_WINDOW_SIZE - 1024:  # the sender has used its window
            await trio.sleep(0.01)
        granted_before.extend(window_updates)
        received.update(await stream.read(8192))
        granted_after_one_read.extend(window_updates)

    digest = await transfer([data], read_size=65536, prelude=one_read_once_the_window_is_used)
    assert digest == blake3.blake3(data).digest()
    assert granted_before == [] and granted_after_one_read  # credit at the first 8 KiB read, not after 128 KiB
