"""Data channel tickets: the next channels to a listener skip the libp2p handshake, each with its own key, only for
the peer they were given to while it is connected and not banned, and a refused one costs a handshake, nothing more."""

import os

import pytest
import trio

from p2p.channel.addresses import socket_reachable
from p2p.channel.service import TICKETS, ChannelConfig, _request_offer, open_data_channel
from p2p.channel.stream import SecureChannelStream
from p2p.channel.tickets import EXPIRY_MARGIN_S, Ticket, TicketBook, ticket_secret
from p2p.errors import ChannelError
from p2p.scores import Verdict
from tests.p2p.channel_helpers import channel_pair, send_and_check


async def open_and_round_trip(client_host, server_host, config: ChannelConfig = ChannelConfig()) -> None:
    """A channel from `client_host` to `server_host` that carries 300 kB intact."""
    channel = await open_data_channel(client_host, server_host.peer_id, config)
    await send_and_check(channel, os.urandom(300_000), server_host.peer_id, client_host.peer_id)


async def test_the_next_channels_use_tickets_and_each_carries_data_intact(pair):
    server, server_host, client_host = pair
    config = ChannelConfig(tickets_per_offer=3)
    with trio.fail_after(30):
        for n in range(1, 6):
            channel = await open_data_channel(client_host, server_host.peer_id, config)
            assert isinstance(channel, SecureChannelStream)
            await send_and_check(channel, os.urandom(300_000), server_host.peer_id, client_host.peer_id)
            # the first channel brings 3 tickets, the next three use them, the fifth needs a handshake again
            assert server.ticket_channels == min(n - 1, 3)
            assert TICKETS.held(client_host.peer_id, server_host.peer_id) == {1: 3, 2: 2, 3: 1, 4: 0, 5: 3}[n]
    assert server.rejected == 0


async def test_a_dialer_asking_for_none_gets_none_and_the_listener_grants_at_most_its_own_count():
    async with channel_pair(config=ChannelConfig(tickets_per_offer=2)) as (server, server_host, client_host):
        with trio.fail_after(20):
            _ip, offer = await _request_offer(client_host, server_host.peer_id, ChannelConfig(tickets_per_offer=0))
            assert offer.tickets == () and offer.ticket_s == 0 and not server._tickets
            _ip, offer = await _request_offer(client_host, server_host.peer_id, ChannelConfig(tickets_per_offer=4))
        assert len(offer.tickets) == 2 and offer.ticket_s == ChannelConfig().ticket_ttl
        for ticket in offer.tickets:  # each ticket's channel has its own secret, derived from the offer's
            assert server._tickets[ticket].secret == ticket_secret(offer.secret, ticket) != offer.secret


async def test_tickets_a_dialer_never_uses_never_lock_it_out_of_offers():
    """A dialer loses track of tickets (a failed connect, a restart): new ones replace its oldest at the listener,
    which never refuses an offer for them."""
    config = ChannelConfig(max_offers_per_peer=3, max_tickets_per_peer=5)
    async with channel_pair(config=config) as (server, server_host, client_host):
        with trio.fail_after(20):
            newest = ()
            for _ in range(3):  # the offers' own tokens are what the per-peer cap counts
                _ip, offer = await _request_offer(client_host, server_host.peer_id, ChannelConfig())
                newest = offer.tickets
            assert len(server._tickets) == 5 and set(newest) <= set(server._tickets)
            with pytest.raises(ChannelError):  # a fourth unclaimed offer is refused, as before tickets
                await _request_offer(client_host, server_host.peer_id, ChannelConfig())


async def test_an_expired_ticket_is_refused_at_the_listener(pair):
    server, server_host, client_host = pair
    with trio.fail_after(20):
        ip, offer = await _request_offer(client_host, server_host.peer_id, ChannelConfig())
        server._tickets[offer.tickets[0]].expires = trio.current_time() - 1
        sock = await trio.open_tcp_stream(ip, offer.port)
        await sock.send_all(offer.tickets[0])
        assert await sock.receive_some(100) == b""
        assert server.rejected == 1 and server.ticket_channels == 0


async def test_ticket_channels_spend_the_handshake_rate_so_they_open_no_faster_than_handshakes():
    config = ChannelConfig(handshakes_per_s=0.001, handshake_burst=3)
    async with channel_pair(config=config) as (server, server_host, client_host):
        with trio.fail_after(20):
            for _ in range(3):  # a handshake, then two tickets: the burst of 3 spent
                await open_and_round_trip(client_host, server_host)
            assert server.ticket_channels == 2
            with pytest.raises(ChannelError):  # the third ticket is refused, and so is the handshake that follows
                await open_data_channel(client_host, server_host.peer_id, ChannelConfig(allow_fallback=False))
        assert server.ticket_channels == 2 and server.refused_handshakes == 2


async def test_a_stolen_ticket_token_opens_nothing_and_its_holder_still_gets_a_channel(pair, caplog):
    """Whoever replays a ticket's token without its secret cannot read or write the channel it opens; the holder,
    refused, drops its tickets and opens a channel with a handshake, and the listener is not marked unreachable."""
    server, server_host, client_host = pair
    with trio.fail_after(30):
        await open_and_round_trip(client_host, server_host)
        stolen = TICKETS.take(client_host.peer_id, server_host.peer_id, trio.current_time())
        TICKETS.forget(client_host.peer_id, server_host.peer_id)
        TICKETS.add(client_host.peer_id, server_host.peer_id, [stolen], 8)  # the holder still counts on this one
        thief = await trio.open_tcp_stream(stolen.ip, stolen.port)
        await thief.send_all(stolen.token + os.urandom(64))  # no key: garbage where a sealed record belongs
        assert await thief.receive_some(1 << 16)  # the accept record, sealed with a key the thief lacks
        await _until_closed(thief)  # then the listener drops the channel: the thief's record does not open
        await thief.aclose()
        channel = await open_data_channel(client_host, server_host.peer_id, ChannelConfig(allow_fallback=False))
        await send_and_check(channel, os.urandom(300_000), server_host.peer_id, client_host.peer_id)
        assert server.ticket_channels == 1  # the thief's; the holder's refused ticket opened nothing
        assert socket_reachable(client_host, server_host.peer_id)


async def _until_closed(stream) -> None:
    """Read until the other end closes; fails the test if it does not within 10 s."""
    with trio.fail_after(10):
        while await stream.receive_some(1 << 16):
            pass


@pytest.mark.parametrize("gone", ["disconnected", "banned"])
async def test_a_ticket_is_refused_once_its_peer_disconnected_or_was_banned(pair, gone):
    server, server_host, client_host = pair
    with trio.fail_after(30):
        await open_and_round_trip(client_host, server_host)
        ticket = TICKETS.take(client_host.peer_id, server_host.peer_id, trio.current_time())
        if gone == "disconnected":
            await server_host.disconnect(client_host.peer_id)
            while client_host.peer_id in server_host.connected_peers():
                await trio.sleep(0.01)
        else:
            for _ in range(100):
                if server_host.faults.penalize(client_host.peer_id, "test", trio.current_time()) is Verdict.BAN:
                    break
        sock = await trio.open_tcp_stream(ticket.ip, ticket.port)
        await sock.send_all(ticket.token)
        assert await sock.receive_some(100) == b""  # dropped without an accept record
        assert server.rejected == 1 and server.ticket_channels == 0


def test_each_ticket_has_its_own_secret_bound_to_the_offers():
    secret = os.urandom(32)
    tokens = [os.urandom(32) for _ in range(4)]
    secrets = [ticket_secret(secret, t) for t in tokens]
    assert len(set(secrets)) == 4 and secret not in secrets and all(len(s) == 32 for s in secrets)
    assert ticket_secret(secret, tokens[0]) == secrets[0]
    assert ticket_secret(os.urandom(32), tokens[0]) != secrets[0]


def _ticket(n: int, expires: float) -> Ticket:
    return Ticket("127.0.0.1", 9, bytes([n]) * 32, b"s" * 32, "aes-256-gcm", expires)


def test_the_book_hands_out_good_tickets_oldest_first_and_stays_bounded():
    book = TicketBook(max_pairs=2)
    book.add("me", "a", [_ticket(1, 100.0), _ticket(2, 200.0)], per_pair=8)
    assert book.take("me", "a", now=0.0).token[0] == 1
    assert book.take("me", "a", now=200.0 - EXPIRY_MARGIN_S) is None  # too close to its end to be used
    assert book.held("me", "a") == 0
    book.add("me", "a", [_ticket(n, 100.0) for n in range(10)], per_pair=3)
    assert book.held("me", "a") == 3 and book.take("me", "a", 0.0).token[0] == 7  # the newest three are kept
    assert book.take("other", "a", 0.0) is None  # per (our peer, their peer): a process may run many peers
    book.add("me", "b", [_ticket(1, 100.0)], 8)
    book.add("me", "c", [_ticket(1, 100.0)], 8)
    assert book.held("me", "a") == 0 and book.held("me", "c") == 1  # past max_pairs the oldest pair goes
    book.forget("me", "c")
    assert book.take("me", "c", 0.0) is None
