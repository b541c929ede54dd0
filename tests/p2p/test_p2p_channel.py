"""The fast data channel between two real libp2p hosts on loopback: handshake, token admission, fallback."""

import logging
import os

import pytest
import trio

from p2p.channel.records import AEADS
from p2p.channel.service import ChannelConfig, DataChannelServer, open_data_channel
from p2p.channel.stream import SecureChannelStream
from p2p.errors import ChannelError
from p2p.host.p2p_host import open_host
from p2p.libp2p_compat import Libp2pByteStream
from tests.p2p.channel_helpers import hash_and_reply, send_and_check, until


@pytest.mark.parametrize("aead", sorted(AEADS))
async def test_data_socket_round_trip_of_a_few_mib_is_blake3_verified(pair, aead):
    server, server_host, client_host = pair
    server.aead = aead  # the listener's offer decides the cipher
    data = os.urandom(5 * 1024 * 1024 + 77)
    with trio.fail_after(30):
        client = await open_data_channel(client_host, server_host.peer_id)
        assert isinstance(client, SecureChannelStream) and client.aead == aead
        await send_and_check(client, data, server_host.peer_id, client_host.peer_id)
    assert server.rejected == 0


async def test_wrong_or_reused_token_is_dropped_at_once(pair):
    server, server_host, client_host = pair
    with trio.fail_after(10):
        stranger = await trio.open_tcp_stream("127.0.0.1", server.port)
        await stranger.send_all(os.urandom(32))
        assert await stranger.receive_some(100) == b""  # dropped without a byte of data
        assert server.rejected == 1
        channel = await open_data_channel(client_host, server_host.peer_id)
        await send_and_check(channel, b"still serving", server_host.peer_id, client_host.peer_id)


async def test_stolen_token_is_single_use(pair):
    from p2p.channel.service import _request_offer

    server, server_host, client_host = pair
    with trio.fail_after(10):
        ip, offer = await _request_offer(client_host, server_host.peer_id, ChannelConfig())
        first = await trio.open_tcp_stream(ip, offer.port)
        await first.send_all(offer.token)
        assert len(await first.receive_some(100)) > 0  # the "accepted" record
        second = await trio.open_tcp_stream(ip, offer.port)
        await second.send_all(offer.token)
        assert await second.receive_some(100) == b""
        assert server.rejected == 1
        await first.aclose()


async def test_unreachable_data_socket_falls_back_to_the_libp2p_stream_logged_once(pair, caplog):
    server, server_host, client_host = pair
    dead = trio.socket.socket()
    await dead.bind(("127.0.0.1", 0))
    server.port = dead.getsockname()[1]  # the offer now names a port nobody listens on
    dead.close()
    data = os.urandom(2 * 1024 * 1024)
    with trio.fail_after(30), caplog.at_level(logging.WARNING, logger="p2p.channel"):
        for _ in range(2):
            client = await open_data_channel(client_host, server_host.peer_id)
            assert isinstance(client, Libp2pByteStream)
            await send_and_check(client, data, server_host.peer_id, client_host.peer_id)
        with pytest.raises(ChannelError, match="unreachable"):
            await open_data_channel(client_host, server_host.peer_id, ChannelConfig(allow_fallback=False))
    assert sum("unreachable" in r.getMessage() for r in caplog.records) == 1


async def test_sender_aborting_mid_transfer_gives_the_receiver_an_error(caplog):
    outcome = {}
    done = trio.Event()

    async def receiver(peer_id, stream):
        try:
            while await stream.receive_some(1 << 20):
                pass
            outcome["result"] = "clean eof"
        except ChannelError as exc:
            outcome["result"] = str(exc)
            raise
        finally:
            done.set()

    async with open_host() as server_host, open_host() as client_host:
        await server_host.nursery.start(DataChannelServer(server_host, receiver).run)
        await client_host.connect(server_host.multiaddrs[0])
        with trio.fail_after(20):
            client = await open_data_channel(client_host, server_host.peer_id)
            await client.send_all(os.urandom(3 * 1024 * 1024))
            await client.abort()  # the sending peer vanishes: no final record
            await done.wait()
        assert "truncated" in outcome["result"]
        assert "data channel handler" in caplog.text  # logged, the host lives on
        channel = await open_data_channel(client_host, server_host.peer_id)
        await channel.send_all(b"x")
        await channel.aclose()


async def test_offer_and_unauthenticated_socket_floods_are_capped():
    from p2p.channel.service import _request_offer

    async with open_host() as server_host, open_host() as client_host:
        config = ChannelConfig(max_offers_per_peer=2, max_pending_sockets=1)
        server = DataChannelServer(server_host, hash_and_reply, config)
        await server_host.nursery.start(server.run)
        await client_host.connect(server_host.multiaddrs[0])
        with trio.fail_after(20):
            for _ in range(2):
                await _request_offer(client_host, server_host.peer_id, config)
            with pytest.raises(ChannelError):
                await _request_offer(client_host, server_host.peer_id, config)
            silent = await trio.open_tcp_stream("127.0.0.1", server.port)  # holds the only pending slot
            await until(lambda: server.pending_sockets == 1)
            flood = await trio.open_tcp_stream("127.0.0.1", server.port)
            assert await flood.receive_some(10) == b""  # dropped at once, without waiting for a token
            assert server.rejected == 1
            await silent.aclose()


@pytest.mark.parametrize("use_socket", [True, False], ids=["data-socket", "libp2p-stream"])
async def test_both_transports_carry_piece_frames_intact(use_socket):
    """Conformance with p2p/pieces/wire.py: frames (one spanning several records) cross intact, then a clean end."""
    from p2p.pieces.wire import FrameDecoder, read_frame, write_frame

    frames = [({"t": "have", "index": 3}, b""), ({"t": "piece", "index": 7}, os.urandom(1_500_000)), ({"t": "x"}, b"y")]
    received = []

    async def collect(peer_id, stream):
        decoder = FrameDecoder()
        while (frame := await read_frame(stream, decoder, 1 << 20)) is not None:
            received.append(frame)
        await stream.send_all(b"done")

    async with open_host() as server_host, open_host() as client_host:
        await server_host.nursery.start(DataChannelServer(server_host, collect).run)
        await client_host.connect(server_host.multiaddrs[0])
        with trio.fail_after(30):
            stream = await open_data_channel(client_host, server_host.peer_id, ChannelConfig(use_socket=use_socket))
            assert stream.transport == ("data-socket" if use_socket else "libp2p-stream")
            for header, payload in frames:
                await write_frame(stream, header, payload)
            await stream.send_eof()
            assert await stream.receive_some(10) == b"done"
            await stream.aclose()
    assert [(h, bytes(p)) for h, p in received] == frames


async def test_an_abandoned_handshake_is_quiet_and_a_truncated_one_is_a_warning(pair, caplog):
    """A peer that opens the handshake stream and closes it at once gave up (no warning); one that stops inside
    its request is logged as a failed handshake; the server serves the next peer either way."""
    from p2p.channel.service import PROTOCOL

    server, server_host, client_host = pair
    with trio.fail_after(30), caplog.at_level(logging.DEBUG, logger="p2p"):
        abandoned = await client_host.new_stream(server_host.peer_id, PROTOCOL)
        await abandoned.close()
        truncated = await client_host.new_stream(server_host.peer_id, PROTOCOL)
        await truncated.write(b"\x00")  # a part of the length prefix
        await truncated.close()
        client = await open_data_channel(client_host, server_host.peer_id)
        await send_and_check(client, os.urandom(1000), server_host.peer_id, client_host.peer_id)
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert any("closed a data channel handshake before sending" in r.getMessage() for r in caplog.records
               if r.levelno == logging.DEBUG)
    assert len(warnings) == 1 and "handshake stream ended early" in warnings[0], warnings


async def test_a_peer_resetting_before_the_offer_is_quiet_and_leaves_no_offer(pair, caplog):
    """The dialer asked for a socket, then reset the stream (its download finished elsewhere): the listener's
    offer cannot go out. That is the peer giving up, not a failure: no warning, and no claimable offer is left."""
    import msgpack

    server, server_host, client_host = pair
    request = msgpack.packb({"v": 1, "mode": "socket", "aeads": sorted(AEADS)}, use_bin_type=True)

    class ResetAfterRequest:
        class muxed_conn:  # noqa: N801 - the attribute path py-libp2p streams have
            peer_id = client_host.peer_id

        def __init__(self):
            self.unread = bytearray(len(request).to_bytes(2, "big") + request)  # the 2-byte length prefix

        async def read(self, n):
            chunk = bytes(self.unread[:n])
            del self.unread[:n]
            return chunk

        async def write(self, data):
            raise RuntimeError("StreamReset")  # what py-libp2p raises on a stream the peer reset

    with trio.fail_after(10), caplog.at_level(logging.DEBUG, logger="p2p"):
        await server._handle_handshake(ResetAfterRequest())
    assert not server._offers
    assert any("reset a data channel handshake before our offer" in r.getMessage() for r in caplog.records)
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


async def test_silent_sockets_of_one_stranger_fill_only_that_ips_places_and_only_briefly():
    """64 silent TCP connections from one stranger must not take every place for the whole handshake timeout (every
    real channel would fall back to the slow stream path): one IP holds a few places, each for the token timeout."""
    async with open_host() as server_host, open_host() as client_host:
        config = ChannelConfig(max_pending_per_ip=2, token_timeout=0.5)
        server = DataChannelServer(server_host, hash_and_reply, config)
        await server_host.nursery.start(server.run)
        await client_host.connect(server_host.multiaddrs[0])
        with trio.fail_after(20):
            silent = [await trio.open_tcp_stream("127.0.0.1", server.port) for _ in range(2)]
            await until(lambda: server.pending_sockets == 2)
            third = await trio.open_tcp_stream("127.0.0.1", server.port)
            assert await third.receive_some(10) == b""  # this IP's places are taken: dropped at once
            for stream in silent:  # and the silent ones are dropped once the token timeout passes
                assert await stream.receive_some(10) == b""
            await until(lambda: server.pending_sockets == 0)
            client = await open_data_channel(client_host, server_host.peer_id)
            assert isinstance(client, SecureChannelStream)  # a real dialer still gets the fast socket
            await send_and_check(client, os.urandom(1 << 16), server_host.peer_id, client_host.peer_id)


async def test_channels_open_at_once_are_capped_node_wide_whoever_asks():
    """Identities are free: past `max_channels` open channels a handshake is refused, from any peer."""
    held = trio.Event()

    async def hold(peer_id, stream):
        await held.wait()

    async with open_host() as server_host, open_host() as first, open_host() as second:
        server = DataChannelServer(server_host, hold, ChannelConfig(max_channels=1))
        await server_host.nursery.start(server.run)
        await first.connect(server_host.multiaddrs[0])
        await second.connect(server_host.multiaddrs[0])
        with trio.fail_after(20):
            channel = await open_data_channel(first, server_host.peer_id)
            await until(lambda: server.open_channels == 1)
            with pytest.raises(ChannelError):
                await open_data_channel(second, server_host.peer_id, ChannelConfig(allow_fallback=False))
            assert server.refused_channels == 1
            held.set()
            await channel.aclose()
            await until(lambda: server.open_channels == 0)
            again = await open_data_channel(second, server_host.peer_id)
            await again.aclose()


async def test_new_handshakes_are_rate_limited_node_wide_whoever_asks():
    """Identities are free: past the node's handshake burst a fresh identity's handshake is closed unread."""
    async with open_host() as server_host, open_host() as first, open_host() as second:
        server = DataChannelServer(server_host, hash_and_reply, ChannelConfig(handshakes_per_s=0.001,
                                                                              handshake_burst=2))
        await server_host.nursery.start(server.run)
        await first.connect(server_host.multiaddrs[0])
        await second.connect(server_host.multiaddrs[0])
        with trio.fail_after(20):
            for _ in range(2):  # the second with a ticket, which spends the rate as a handshake does
                await (await open_data_channel(first, server_host.peer_id)).aclose()
            with pytest.raises(ChannelError):
                await open_data_channel(second, server_host.peer_id, ChannelConfig(allow_fallback=False))
        assert server.refused_handshakes == 1


async def test_loopback_strangers_meet_the_per_ip_cap_unless_exempted():
    for exempt, dropped in ((False, True), (True, False)):
        async with open_host() as server_host:
            config = ChannelConfig(max_pending_per_ip=1, exempt_loopback=exempt)
            server = DataChannelServer(server_host, hash_and_reply, config)
            await server_host.nursery.start(server.run)
            with trio.fail_after(20):
                silent = await trio.open_tcp_stream("127.0.0.1", server.port)
                await until(lambda: server.pending_sockets == 1)
                second = await trio.open_tcp_stream("127.0.0.1", server.port)
                if dropped:
                    assert await second.receive_some(10) == b""
                else:
                    await until(lambda: server.pending_sockets == 2)
                assert server.rejected == int(dropped)
                await silent.aclose()
                await second.aclose()


async def test_strangers_unclaimed_offers_never_lock_out_a_new_dialer():
    """Offers cost no socket, so they do not count towards the channel cap; past it the oldest unclaimed goes."""
    from p2p.channel.service import _request_offer

    async with open_host() as server_host, open_host() as client_host:
        config = ChannelConfig(max_channels=2, max_offers_per_peer=8)
        server = DataChannelServer(server_host, hash_and_reply, config)
        await server_host.nursery.start(server.run)
        await client_host.connect(server_host.multiaddrs[0])
        with trio.fail_after(20):
            for _ in range(4):  # never claimed
                await _request_offer(client_host, server_host.peer_id, config)
            assert len(server._offers) == 2
            client = await open_data_channel(client_host, server_host.peer_id, config)
            assert isinstance(client, SecureChannelStream)
            await send_and_check(client, os.urandom(1000), server_host.peer_id, client_host.peer_id)
