"""Reads of a libp2p TCP connection are served from one larger socket read (p2p.libp2p_compat.read_tcp_ahead): in
order whoever reads, never more than asked, and the socket is read once for frames that arrived together."""

from __future__ import annotations

import trio
from libp2p.io.trio import TrioTCPStream

from p2p.libp2p_compat import read_tcp_ahead


class CountedSocket:
    """A trio SocketStream that counts its reads."""

    def __init__(self, stream: trio.SocketStream) -> None:
        self.stream = stream
        self.reads = 0

    async def receive_some(self, max_bytes: int | None = None) -> bytes:
        self.reads += 1
        return await self.stream.receive_some(max_bytes)

    async def send_all(self, data: bytes) -> None:
        await self.stream.send_all(data)


async def _pair() -> tuple[TrioTCPStream, CountedSocket, trio.SocketStream]:
    read_tcp_ahead()
    left, right = trio.socket.socketpair()
    counted = CountedSocket(trio.SocketStream(left))
    return TrioTCPStream(counted), counted, trio.SocketStream(right)


def _noise_like(bodies: list[bytes]) -> bytes:
    return b"".join(len(body).to_bytes(2, "big") + body for body in bodies)


async def test_frames_that_arrived_together_cost_one_socket_read():
    with trio.fail_after(5):
        reader, counted, writer = await _pair()
        bodies = [bytes([i]) * (10 + 50 * i) for i in range(20)]
        await writer.send_all(_noise_like(bodies))
        got = []
        for _ in bodies:
            length = int.from_bytes(await reader.read(2), "big")  # as Noise reads: the length, then the body
            got.append(await reader.read(length))
        assert got == bodies
        assert counted.reads == 1  # py-libp2p's own read asks the socket twice per frame: 40 reads


async def test_a_read_never_returns_more_than_asked_and_none_takes_what_is_there():
    with trio.fail_after(5):
        reader, _, writer = await _pair()
        await writer.send_all(b"abcdefgh")
        assert await reader.read(3) == b"abc"
        assert await reader.read(0) == b""
        assert await reader.read(None) == b"defgh"
        await writer.send_all(b"ij")
        assert await reader.read(100) == b"ij"
        await writer.aclose()
        assert await reader.read(10) == b""  # EOF passes through once the bytes read ahead are gone


async def test_two_readers_get_the_bytes_in_the_order_the_socket_gave_them():
    """A reader that waited on the socket while another left bytes behind must not return its newer bytes first."""
    with trio.fail_after(5):
        reader, _, writer = await _pair()
        got: dict[str, bytes] = {}

        async def read(name: str) -> None:
            got[name] = await reader.read(2)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(read, "first")
            await trio.testing.wait_all_tasks_blocked()
            nursery.start_soon(read, "second")
            await trio.testing.wait_all_tasks_blocked()  # both wait: the first on the socket, the second its turn
            await writer.send_all(b"abcdef")
            await trio.testing.wait_all_tasks_blocked()
            await writer.send_all(b"gh")
        assert got == {"first": b"ab", "second": b"cd"}
        assert await reader.read(10) == b"efgh"
