"""The manifest request protocol between real loopback hosts: answers, unknown ids, and peers that misbehave.

A peer that closes or resets the stream mid-answer, or announces an oversized manifest, must cost the asker one
HostError, never an exception of py-libp2p's own: one such StreamEOF escaped a heartbeat-triggered fetch and ended
a whole simulation.
"""

from __future__ import annotations

import pytest
import trio

from p2p.errors import HostError
from p2p.host.p2p_host import open_host, read_exactly
from swarm.policy.manifest_protocol import PROTOCOL, fetch_manifest, install_manifest_server

KNOWN = b"k" * 32


async def close_without_answering(stream):
    await read_exactly(stream, 32)
    await stream.close()


async def reset_without_answering(stream):
    await read_exactly(stream, 32)
    await stream.reset()


async def announce_too_much(stream):
    await read_exactly(stream, 32)
    await stream.write((1 << 31).to_bytes(4, "big"))


async def answer_half(stream):
    await read_exactly(stream, 32)
    await stream.write((100).to_bytes(4, "big") + b"x" * 10)
    await stream.close()


async def test_a_known_manifest_is_answered_and_an_unknown_one_is_none():
    async with open_host() as server, open_host() as client:
        install_manifest_server(server, {KNOWN: b"signed manifest bytes"}.get)
        with trio.fail_after(20):
            await client.connect(server.multiaddrs[0])
            assert await fetch_manifest(client, server.peer_id, KNOWN) == b"signed manifest bytes"
            assert await fetch_manifest(client, server.peer_id, b"u" * 32) is None


@pytest.mark.parametrize("handler", [close_without_answering, reset_without_answering, announce_too_much,
                                     answer_half])
async def test_a_misbehaving_server_costs_one_host_error(handler):
    async with open_host() as server, open_host() as client:
        server.set_guarded_handler(PROTOCOL, handler)
        with trio.fail_after(30):
            await client.connect(server.multiaddrs[0])
            with pytest.raises(HostError):
                await fetch_manifest(client, server.peer_id, KNOWN, timeout=5.0)
