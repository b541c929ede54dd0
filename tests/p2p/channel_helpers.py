"""What the data channel tests share: a listener callback that hashes what it gets, a round trip checked against it,
and a listener and a dialer host connected to each other (`channel_pair`)."""

from __future__ import annotations

from contextlib import asynccontextmanager

import blake3
import trio

from p2p.channel.service import ChannelConfig, DataChannelServer
from p2p.host.p2p_host import open_host


async def hash_and_reply(peer_id, stream):
    """Server callback: hash everything until EOF, answer with the digest and the peer id it was told."""
    hasher = blake3.blake3()
    while chunk := await stream.receive_some(1 << 20):
        hasher.update(chunk)
    await stream.send_all(hasher.digest() + peer_id.encode())


async def until(condition):
    """Yield to the scheduler (no clock involved) until the server has reacted to a socket event."""
    while not condition():
        await trio.lowlevel.checkpoint()


async def send_and_check(client, data, server_peer_id, client_peer_id):
    await client.send_all(data)
    await client.send_eof()
    reply = b""
    while chunk := await client.receive_some(4096):
        reply += chunk
    assert reply == blake3.blake3(data).digest() + client_peer_id.encode()
    assert client.peer_id == server_peer_id
    await client.aclose()


@asynccontextmanager
async def channel_pair(callback=hash_and_reply, config: ChannelConfig = ChannelConfig()):
    """A listener host serving data channels with `callback` under `config` and a dialer host connected to it."""
    async with open_host() as server_host, open_host() as client_host:
        server = DataChannelServer(server_host, callback, config)
        await server_host.nursery.start(server.run)
        await client_host.connect(server_host.multiaddrs[0])
        yield server, server_host, client_host
