"""Loopback tests of the secure host factory with real py-libp2p hosts (Noise, Yamux, TCP on 127.0.0.1)."""

import logging

import pytest
import trio
from libp2p.network.stream.exceptions import StreamError

from p2p.errors import HostError
from p2p.host import HostConfig, open_host

ECHO = "/test/echo/1"
PEER = "12D3KooWCRdwY7d9wf6inqzAJLp86LghWeBAoQX5Lo6T7T3uXXN7"


async def echo_reversed(stream):
    data = await stream.read(1024)
    await stream.write(data[::-1])
    await stream.close()


async def ask(host, peer_id, protocol, payload=b"hello"):
    stream = await host.new_stream(peer_id, protocol)
    await stream.write(payload)
    reply = await stream.read(1024)
    await stream.close()
    return reply


async def test_two_hosts_connect_and_exchange_on_a_custom_protocol():
    async with open_host() as a, open_host() as b:
        (addr,) = a.multiaddrs
        assert addr.startswith("/ip4/127.0.0.1/tcp/") and addr.endswith(f"/p2p/{a.peer_id}")
        assert not addr.startswith("/ip4/127.0.0.1/tcp/0/")
        a.set_guarded_handler(ECHO, echo_reversed)
        with trio.fail_after(10):
            assert await b.connect(addr) == a.peer_id
            assert await ask(b, a.peer_id, ECHO) == b"olleh"


async def test_identity_from_data_dir_gives_a_stable_peer_id(tmp_path):
    async with open_host(HostConfig(data_dir=tmp_path)) as a:
        first = a.peer_id
    async with open_host(HostConfig(data_dir=tmp_path)) as a:
        assert a.peer_id == first and a.multiaddrs[0].endswith(first)


async def test_plaintext_dialer_is_rejected():
    from libp2p import new_host
    from libp2p.crypto.ed25519 import create_new_key_pair
    from libp2p.peer.peerinfo import info_from_p2p_addr
    from libp2p.security.insecure.transport import PLAINTEXT_PROTOCOL_ID, InsecureTransport
    from libp2p.stream_muxer.yamux.yamux import PROTOCOL_ID as YAMUX_ID
    from libp2p.stream_muxer.yamux.yamux import Yamux
    from multiaddr import Multiaddr

    key_pair = create_new_key_pair()
    plain = new_host(
        key_pair=key_pair,
        sec_opt={PLAINTEXT_PROTOCOL_ID: InsecureTransport(key_pair)},
        muxer_opt={YAMUX_ID: Yamux},
    )
    async with open_host() as secure, plain.run([Multiaddr("/ip4/127.0.0.1/tcp/0")]):
        secure.set_guarded_handler(ECHO, echo_reversed)
        with trio.fail_after(20), pytest.raises(Exception):
            await plain.connect(info_from_p2p_addr(Multiaddr(secure.multiaddrs[0])))
        assert secure.libp2p.get_connected_peers() == []


async def test_raising_and_hanging_handlers_reset_the_stream_and_the_host_survives(caplog):
    async def boom(stream):
        await stream.read(1024)
        raise RuntimeError("handler bug")

    async def hang(stream):
        await trio.sleep_forever()

    async with open_host() as a, open_host() as b:
        a.set_guarded_handler("/test/boom/1", boom)
        a.set_guarded_handler("/test/hang/1", hang, timeout=0.5)
        a.set_guarded_handler(ECHO, echo_reversed)
        with trio.fail_after(15), caplog.at_level(logging.WARNING, logger="p2p.host"):
            await b.connect(a.multiaddrs[0])
            for protocol in ("/test/boom/1", "/test/hang/1"):
                with pytest.raises(StreamError):  # the reset reaches the client as an error, not data
                    await ask(b, a.peer_id, protocol)
            assert await ask(b, a.peer_id, ECHO, b"still up") == b"pu llits"
        assert "handler bug" in caplog.text and "exceeded 0.5 s" in caplog.text


async def test_unreachable_bootstrap_is_one_log_line_and_the_host_still_starts(caplog):
    dead = f"/ip4/127.0.0.1/tcp/1/p2p/{PEER}"
    with caplog.at_level(logging.WARNING):
        async with open_host() as a, open_host(HostConfig(bootstrap=(a.multiaddrs[0], dead))) as b:
            assert set(b.bootstrap_failures) == {dead}
            assert a.peer_id in {str(p) for p in b.libp2p.get_connected_peers()}
    lines = [r.getMessage() for r in caplog.records if "unreachable" in r.getMessage() or "127.0.0.1:1" in r.getMessage()]
    assert len(lines) == 1 and dead in lines[0] and "\n" not in lines[0]


async def test_dial_and_stream_errors_are_one_sentence_host_errors():
    async with open_host() as a:
        with pytest.raises(HostError, match="not a valid multiaddr"):
            await a.connect("/ip4/nonsense")
        with pytest.raises(HostError, match="cannot open"):
            await a.new_stream(PEER, ECHO)
    with pytest.raises(HostError, match="handler_timeout"):
        HostConfig(handler_timeout=0)
