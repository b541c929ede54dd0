"""Faults stay where they happen: an arbitrary exception injected into a stream handler or into the manifest
server resets that one stream, costs the peer that opened it score, is logged in one line, and the host keeps
serving everyone else; a peer that keeps tripping handlers is banned and disconnected."""

from __future__ import annotations

import logging

import pytest
import trio
from libp2p.network.stream.exceptions import StreamError

from p2p.errors import HostError
from p2p.host.p2p_host import open_host
from swarm.policy import manifest_protocol
from swarm.policy.manifest_protocol import fetch_manifest, install_manifest_server

ECHO = "/test/echo/1"
FRAGILE = "/test/fragile/1"
KNOWN = b"k" * 32


async def echo(stream):
    data = await stream.read(1024)
    await stream.write(data)
    await stream.close()


async def ask(host, peer_id, protocol, payload=b"ping"):
    stream = await host.new_stream(peer_id, protocol)
    await stream.write(payload)
    reply = await stream.read(1024)
    await stream.close()
    return reply


class Injected:
    """A handler whose body can be made to raise whatever a test injects (monkeypatched per test)."""

    def __init__(self) -> None:
        self.calls = 0

    async def work(self, data: bytes) -> bytes:
        return data

    async def __call__(self, stream) -> None:
        self.calls += 1
        reply = await self.work(await stream.read(1024))
        await stream.write(reply)
        await stream.close()


async def test_an_injected_exception_resets_one_stream_penalises_its_peer_and_the_host_keeps_serving(
        monkeypatch, caplog):
    fragile = Injected()

    async def explode(data):
        raise RuntimeError("injected fault")

    monkeypatch.setattr(fragile, "work", explode)
    faults = []
    async with open_host() as server, open_host() as hostile, open_host() as honest:
        server.set_guarded_handler(FRAGILE, fragile)
        server.set_guarded_handler(ECHO, echo)
        server.fault_listeners.append(lambda peer, protocol: faults.append((peer, protocol)))
        with trio.fail_after(20), caplog.at_level(logging.WARNING, logger="p2p.host"):
            await hostile.connect(server.multiaddrs[0])
            await honest.connect(server.multiaddrs[0])
            with pytest.raises(StreamError):
                await ask(hostile, server.peer_id, FRAGILE)
            assert await ask(hostile, server.peer_id, ECHO) == b"ping"  # one fault is not a ban
            assert await ask(honest, server.peer_id, ECHO, b"still up") == b"still up"
        assert faults == [(hostile.peer_id, FRAGILE)]
        assert server.faults.score(hostile.peer_id, trio.current_time()) < 0
        assert server.faults.score(honest.peer_id, trio.current_time()) == 0
        lines = [r.getMessage() for r in caplog.records if "injected fault" in r.getMessage()]
        assert len(lines) == 1 and FRAGILE in lines[0] and "\n" not in lines[0]


async def test_a_peer_that_keeps_tripping_a_handler_is_banned_disconnected_and_refused():
    fragile = Injected()

    async def explode(data):
        raise KeyError("injected")

    fragile.work = explode
    async with open_host() as server, open_host() as hostile, open_host() as honest:
        server.set_guarded_handler(FRAGILE, fragile)
        server.set_guarded_handler(ECHO, echo)
        with trio.fail_after(30):
            await hostile.connect(server.multiaddrs[0])
            await honest.connect(server.multiaddrs[0])
            for _ in range(3):
                assert not server.faults.is_banned(hostile.peer_id, trio.current_time())
                with pytest.raises(StreamError):
                    await ask(hostile, server.peer_id, FRAGILE)
            assert server.faults.is_banned(hostile.peer_id, trio.current_time())
            while hostile.peer_id in {str(p) for p in server.libp2p.get_connected_peers()}:
                await trio.sleep(0.01)
            calls = fragile.calls
            with pytest.raises((HostError, StreamError)):  # redialing is possible; being served is not
                await hostile.connect(server.multiaddrs[0])
                await ask(hostile, server.peer_id, FRAGILE)
            assert fragile.calls == calls
            assert await ask(honest, server.peer_id, ECHO, b"served") == b"served"


async def test_an_injected_fault_in_the_manifest_server_costs_one_host_error_and_it_keeps_answering(monkeypatch):
    table = {KNOWN: b"signed manifest bytes"}
    broken = {"on": True}

    def lookup(manifest_id):
        if broken["on"]:
            raise RuntimeError("injected lookup fault")
        return table.get(manifest_id)

    async with open_host() as server, open_host() as client:
        install_manifest_server(server, lookup)
        with trio.fail_after(30):
            await client.connect(server.multiaddrs[0])
            with pytest.raises(HostError):
                await fetch_manifest(client, server.peer_id, KNOWN, timeout=5.0)
            assert server.faults.score(client.peer_id, trio.current_time()) < 0
            broken["on"] = False
            assert await fetch_manifest(client, server.peer_id, KNOWN) == b"signed manifest bytes"


async def test_an_unforeseen_error_while_fetching_a_manifest_is_a_host_error(monkeypatch):
    """Callers of fetch_manifest (heartbeats, announcements, the DHT lookup, `swarm status`) catch HostError only:
    anything else escaping it would end the node or the command."""

    real_read = manifest_protocol.read_exactly

    async def broken_read(stream, n, what="stream"):
        if n == 32:  # the server reading its request is left alone
            return await real_read(stream, n, what)
        raise RuntimeError("injected read fault")

    async with open_host() as server, open_host() as client:
        install_manifest_server(server, {KNOWN: b"bytes"}.get)
        monkeypatch.setattr(manifest_protocol, "read_exactly", broken_read)
        with trio.fail_after(20):
            await client.connect(server.multiaddrs[0])
            with pytest.raises(HostError, match="broke the manifest exchange"):
                await fetch_manifest(client, server.peer_id, KNOWN, timeout=5.0)


async def test_a_failing_fault_listener_does_not_end_the_host():
    fragile = Injected()

    async def explode(data):
        raise ValueError("injected")

    def broken_listener(peer, protocol):
        raise RuntimeError("listener bug")

    fragile.work = explode
    async with open_host() as server, open_host() as client:
        server.set_guarded_handler(FRAGILE, fragile)
        server.set_guarded_handler(ECHO, echo)
        server.fault_listeners.append(broken_listener)
        with trio.fail_after(20):
            await client.connect(server.multiaddrs[0])
            with pytest.raises(StreamError):
                await ask(client, server.peer_id, FRAGILE)
            assert await ask(client, server.peer_id, ECHO) == b"ping"
