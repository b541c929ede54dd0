"""Loopback tests of the secure host factory with real py-libp2p hosts (Noise, Yamux, TCP on 127.0.0.1)."""

import logging

import pytest
import trio
from libp2p.network.stream.exceptions import StreamError

from p2p.errors import HostError
from p2p.host.p2p_host import HostConfig, open_host, read_exactly

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


def _insecure_or_mplex_host(kind):
    """A plain py-libp2p host offering plaintext security, or Noise with Mplex, or (control) Noise with Yamux."""
    from libp2p import new_host
    from libp2p.crypto.ed25519 import create_new_key_pair
    from libp2p.crypto.x25519 import create_new_key_pair as new_x25519
    from libp2p.security.insecure.transport import PLAINTEXT_PROTOCOL_ID, InsecureTransport
    from libp2p.security.noise.transport import PROTOCOL_ID as NOISE_ID
    from libp2p.security.noise.transport import Transport as NoiseTransport
    from libp2p.stream_muxer.mplex.mplex import MPLEX_PROTOCOL_ID, Mplex
    from libp2p.stream_muxer.yamux.yamux import PROTOCOL_ID as YAMUX_ID
    from libp2p.stream_muxer.yamux.yamux import Yamux

    key_pair = create_new_key_pair()
    if kind == "plaintext":
        return new_host(
            key_pair=key_pair,
            sec_opt={PLAINTEXT_PROTOCOL_ID: InsecureTransport(key_pair)},
            muxer_opt={YAMUX_ID: Yamux},
        )
    noise = NoiseTransport(libp2p_keypair=key_pair, noise_privkey=new_x25519().private_key)
    muxer = {MPLEX_PROTOCOL_ID: Mplex} if kind == "mplex" else {YAMUX_ID: Yamux}
    return new_host(key_pair=key_pair, sec_opt={NOISE_ID: noise}, muxer_opt=muxer)


@pytest.mark.parametrize("kind", ["plaintext", "mplex"])
async def test_plaintext_or_mplex_dialer_is_rejected(kind):
    from libp2p.network.exceptions import SwarmException
    from libp2p.peer.peerinfo import info_from_p2p_addr
    from multiaddr import Multiaddr

    other = _insecure_or_mplex_host(kind)
    async with open_host() as secure, other.run([Multiaddr("/ip4/127.0.0.1/tcp/0")]):
        secure.set_guarded_handler(ECHO, echo_reversed)
        with trio.fail_after(20), pytest.raises(SwarmException):
            await other.connect(info_from_p2p_addr(Multiaddr(secure.multiaddrs[0])))
        assert secure.libp2p.get_connected_peers() == []


async def test_a_noise_yamux_dialer_built_the_same_way_is_accepted():
    """Control for the rejection test: the same construction with Noise + Yamux does connect."""
    from libp2p.peer.peerinfo import info_from_p2p_addr
    from multiaddr import Multiaddr

    other = _insecure_or_mplex_host("control")
    async with open_host() as secure, other.run([Multiaddr("/ip4/127.0.0.1/tcp/0")]):
        with trio.fail_after(20):
            await other.connect(info_from_p2p_addr(Multiaddr(secure.multiaddrs[0])))
        assert [str(p) for p in other.get_connected_peers()] == [secure.peer_id]


async def test_raising_and_hanging_handlers_reset_the_stream_and_the_host_survives(caplog):
    async def boom(stream):
        await stream.read(1024)
        raise RuntimeError("handler bug")

    async def hang(stream):
        await trio.sleep_forever()

    async def wants_more(stream):
        await read_exactly(stream, 32, "request")  # the client sends 8 bytes and closes: it went away

    async with open_host() as a, open_host() as b:
        a.set_guarded_handler("/test/boom/1", boom)
        a.set_guarded_handler("/test/short/1", wants_more)
        a.set_guarded_handler("/test/hang/1", hang, timeout=0.5)
        a.set_guarded_handler("/test/idle/1", hang, timeout=0.5, idle_streams=True)  # e.g. Kademlia's streams
        a.set_guarded_handler(ECHO, echo_reversed)
        with trio.fail_after(15), caplog.at_level(logging.DEBUG, logger="p2p.host"):
            await b.connect(a.multiaddrs[0])
            for protocol in ("/test/boom/1", "/test/hang/1", "/test/idle/1"):
                with pytest.raises(StreamError):  # the reset reaches the client as an error, not data
                    await ask(b, a.peer_id, protocol)
            assert await ask(b, a.peer_id, ECHO, b"still up") == b"pu llits"
            short = await b.new_stream(a.peer_id, "/test/short/1")
            await short.write(b"8 bytes.")
            await short.close()  # a requester giving up before its request was whole
            while "/test/short/1 failed" not in caplog.text:
                await trio.sleep(0.01)
        warnings = " ".join(r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING)
        assert "handler bug" in warnings and "/test/hang/1 exceeded 0.5 s" in warnings
        assert "/test/idle/1" not in warnings and "/test/idle/1 exceeded 0.5 s" in caplog.text  # closed, quietly
        assert "/test/short/1" not in warnings  # a peer that went away is routine: a debug line


async def test_unreachable_bootstrap_is_one_log_line_and_the_host_still_starts(caplog):
    dead = f"/ip4/127.0.0.1/tcp/1/p2p/{PEER}"
    with caplog.at_level(logging.INFO):
        async with open_host() as a, open_host(HostConfig(bootstrap=(a.multiaddrs[0], dead))) as b:
            assert set(b.bootstrap_failures) == {dead}
            assert a.peer_id in {str(p) for p in b.libp2p.get_connected_peers()}
    records = [r for r in caplog.records if "unreachable" in r.getMessage() or "127.0.0.1:1" in r.getMessage()]
    lines = [r.getMessage() for r in records]
    assert len(lines) == 1 and dead in lines[0] and "\n" not in lines[0]
    assert records[0].levelno == logging.INFO  # the caller reports it (swarm peer start: one warning line)


async def test_dial_and_stream_errors_are_one_sentence_host_errors():
    async with open_host() as a:
        with pytest.raises(HostError, match="not a valid multiaddr"):
            await a.connect("/ip4/nonsense")
        with pytest.raises(HostError, match="cannot open"):
            await a.new_stream(PEER, ECHO)
    with pytest.raises(HostError, match="handler_timeout"):
        HostConfig(handler_timeout=0)


def test_an_unspecified_listen_ip_is_given_out_as_each_interface_address_loopback_last():
    """A peer listening on every interface printed /ip4/0.0.0.0/...: no other machine can dial that."""
    from p2p.host.addresses import dialable, interface_ips

    ips = {"ip4": ["10.1.2.3", "127.0.0.1"], "ip6": ["2001:db8::5", "::1"]}
    bound = ["/ip4/0.0.0.0/tcp/4001", "/ip6/::/tcp/4002", "/ip4/127.0.0.1/tcp/5", "/ip4/10.1.2.3/tcp/4001"]
    assert dialable(bound, ips) == ["/ip4/10.1.2.3/tcp/4001", "/ip4/127.0.0.1/tcp/4001", "/ip6/2001:db8::5/tcp/4002",
                                    "/ip6/::1/tcp/4002", "/ip4/127.0.0.1/tcp/5"]
    assert dialable(["/ip4/0.0.0.0/tcp/1"], {"ip4": [], "ip6": []}) == []
    here = interface_ips()
    assert here["ip4"][-1].startswith("127.") and "0.0.0.0" not in here["ip4"]
    assert not any(ip.startswith("fe80") for ip in here["ip6"])


async def test_announce_addresses_replace_the_listen_addresses_given_out():
    config = HostConfig(announce=("/ip4/203.0.113.7/tcp/4001",))
    async with open_host(config) as host:
        assert host.multiaddrs == [f"/ip4/203.0.113.7/tcp/4001/p2p/{host.peer_id}"]
        (bound,) = host.bound_multiaddrs
        assert bound.startswith("/ip4/127.0.0.1/tcp/") and "/p2p/" not in bound
    with pytest.raises(HostError, match="must not name a peer id"):
        HostConfig(announce=(f"/ip4/203.0.113.7/tcp/4001/p2p/{PEER}",))


async def test_a_port_another_peer_listens_on_is_refused_not_silently_shared():
    """py-libp2p listens with SO_REUSEPORT: a second host on the same port bound it too, and the kernel split the
    incoming connections between two peers of different ids."""
    async with open_host() as first:
        port = first.multiaddrs[0].split("/tcp/")[1].split("/")[0]
        with pytest.raises(HostError, match=f"port {port} is in use"):
            async with open_host(HostConfig(listen=(f"/ip4/127.0.0.1/tcp/{port}",))):
                pass


async def test_an_ip_that_is_not_this_machines_is_one_host_error():
    """py-libp2p logged the failed bind and ran a host with no address; the data channel server then failed deep
    inside the peer's nurseries."""
    with pytest.raises(HostError, match="no address could be bound"):
        async with open_host(HostConfig(listen=("/ip4/192.0.2.1/tcp/4001",))):
            pass


async def test_a_closed_host_stops_listening_and_its_port_can_be_listened_on_again():
    """py-libp2p left the listening socket open after its host stopped: the port kept accepting connections nobody
    served, and a peer restarted in the same process (a test, a simulation) found its port in use."""
    import socket

    async with open_host() as first:
        port = first.multiaddrs[0].split("/tcp/")[1].split("/")[0]
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", int(port)), timeout=1).close()
    async with open_host(HostConfig(listen=(f"/ip4/127.0.0.1/tcp/{port}",))) as again:
        assert f"/tcp/{port}/" in again.multiaddrs[0]


async def test_one_connection_per_peer_even_when_it_listens_on_several_addresses():
    """A peer known by several addresses, dialed again, and dialed back from the other side: still one connection
    each way (each extra one costs a Noise handshake and splits the peer's streams). Two dials that cross in flight
    can leave two for a while; py-libp2p trims the extra one past its grace period (docs/limits.md)."""
    import socket

    from libp2p.peer.id import ID
    from libp2p.peer.peerinfo import PeerInfo
    from multiaddr import Multiaddr

    with socket.socket() as probe:  # a second, fixed port (two port-0 listen addresses are one to py-libp2p)
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    two_ports = HostConfig(listen=("/ip4/127.0.0.1/tcp/0", f"/ip4/127.0.0.1/tcp/{port}"))
    async with open_host(two_ports) as a, open_host() as b:
        assert len(a.multiaddrs) == 2
        with trio.fail_after(20):
            addrs = [Multiaddr(addr.rsplit("/p2p/", 1)[0]) for addr in a.multiaddrs]
            await b.libp2p.connect(PeerInfo(ID.from_base58(a.peer_id), addrs))
            await a.connect(b.multiaddrs[0])
            await b.redial(a.multiaddrs[1])
        assert len(a.libp2p.get_network().get_connections(ID.from_base58(b.peer_id))) == 1
        assert len(b.libp2p.get_network().get_connections(ID.from_base58(a.peer_id))) == 1


async def test_a_dial_to_a_socket_that_never_answers_times_out_in_one_sentence():
    """A TCP port that accepts and then says nothing (a hung peer, a black-holing middlebox) must not hold a dial
    for ever: the Noise handshake waits on it, and the dial timeout ends it."""
    listener = await trio.open_tcp_listeners(0, host="127.0.0.1")
    port = listener[0].socket.getsockname()[1]
    accepted = []

    async def accept_and_hang():
        while True:
            accepted.append(await listener[0].accept())

    async with trio.open_nursery() as nursery, open_host(HostConfig(dial_timeout=1.0, stream_timeout=1.0)) as a:
        nursery.start_soon(accept_and_hang)
        started = trio.current_time()
        with pytest.raises(HostError, match="timed out after 1 s"):
            await a.connect(f"/ip4/127.0.0.1/tcp/{port}/p2p/{PEER}")
        assert trio.current_time() - started < 5 and accepted
        nursery.cancel_scope.cancel()
    for stream in accepted:
        await stream.aclose()
    await listener[0].aclose()


@pytest.mark.parametrize("listen", ["/ip4/127.0.0.1/udp/5", "/dns4/localhost/tcp/5", "/ip4/127.0.0.1",
                                    f"/ip4/127.0.0.1/tcp/0/p2p/{PEER}"])
def test_a_listen_address_that_is_not_ip_and_tcp_is_one_host_error(listen):
    """A UDP address was reported as "no address could be bound (is the IP one of this machine's?)"."""
    with pytest.raises(HostError, match=r"must be /ip4/IP/tcp/PORT or /ip6/IP/tcp/PORT"):
        HostConfig(listen=(listen,))


async def test_a_closed_host_closes_the_connections_it_had_and_its_peers_see_them_end():
    """py-libp2p's host leaves its connections open when it stops (nothing closes their sockets): the peers it
    had kept them, and all they had granted it (a relay's reservation, a circuit's place) for as long."""
    async with open_host() as server:
        async with open_host() as client:
            await client.connect(server.multiaddrs[0])
            conns = server.libp2p.get_network().connections[client.libp2p.get_id()]
            (conn,) = conns if isinstance(conns, list) else [conns]
        assert not client.libp2p.get_network().connections
        with trio.fail_after(5):
            await conn.event_closed.wait()
        assert client.peer_id not in server.connected_peers()


async def test_inbound_connections_that_ended_give_their_place_back():
    """py-libp2p holds a place under its inbound cap for each connection until the whole host stops, not until the
    connection ends: a public peer that had accepted max_connections - min_connections connections in its life
    turned every new one away, whoever asked. Here a peer whose cap is three takes a fourth once one has left."""
    async with open_host() as server:
        server.libp2p.get_network()._inbound_limiter.total_tokens = 3
        served = 0
        for _ in range(4):
            async with open_host() as client:
                await client.connect(server.multiaddrs[0])
                with trio.fail_after(5):
                    stream = await client.new_stream(server.peer_id, "/ipfs/id/1.0.0")
                    await stream.reset()
                served += 1
        assert served == 4
