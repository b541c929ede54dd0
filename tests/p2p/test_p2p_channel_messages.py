"""The data channel's handshake decoders: typed values or HandshakeBreach, never another exception.

A listener that answered an offer with a field of the wrong type (a list where a cipher name belongs) raised a
TypeError in the dialer that escaped the mirror's nursery and stopped the whole node a second after connecting.
"""

import msgpack
import pytest
import trio
from hypothesis import given, settings
from hypothesis import strategies as st

from p2p.channel.messages import (
    MAX_MESSAGE,
    ChannelOffer,
    ChannelRequest,
    HandshakeBreach,
    decode_offer,
    decode_request,
    encode_offer,
    encode_request,
)
from p2p.channel.service import PROTOCOL, ChannelConfig, open_data_channel
from p2p.errors import ChannelError
from p2p.host.p2p_host import open_host

OFFER = ChannelOffer(4242, b"t" * 32, b"s" * 32, "aes-256-gcm")
REQUEST = ChannelRequest("socket", ("aes-256-gcm", "chacha20-poly1305"))


def test_valid_messages_round_trip():
    assert decode_offer(encode_offer(OFFER)) == OFFER
    with_tickets = ChannelOffer(4242, b"t" * 32, b"s" * 32, "aes-256-gcm", (b"a" * 32, b"b" * 32), 300)
    assert decode_offer(encode_offer(with_tickets)) == with_tickets
    asking = ChannelRequest("socket", ("aes-256-gcm",), 3)
    assert decode_request(encode_request(asking)) == asking
    assert decode_request(encode_request(REQUEST)) == REQUEST
    assert decode_request(encode_request(ChannelRequest("stream", None))) == ChannelRequest("stream", None)


@pytest.mark.parametrize("field, value", [
    ("aead", ["aes-256-gcm"]), ("aead", {"a": 1}), ("aead", 7), ("port", "80"), ("port", True), ("port", 70000),
    ("port", 1.5), ("token", "t" * 32), ("token", b"short"), ("secret", None), ("v", "1"), ("v", 2),
    ("ticket_s", 300),  # a lifetime without tickets
])
def test_an_offer_with_a_field_of_the_wrong_type_is_a_breach(field, value):
    body = {"v": 1, "port": OFFER.port, "token": OFFER.token, "secret": OFFER.secret, "aead": OFFER.aead}
    body[field] = value
    with pytest.raises(HandshakeBreach):
        decode_offer(msgpack.packb(body, use_bin_type=True))


@pytest.mark.parametrize("body", [
    {"v": 1, "mode": ["socket"]}, {"v": 1, "mode": "socket", "aeads": "aes-256-gcm"},
    {"v": 1, "mode": "socket", "aeads": [1, 2]}, {"v": 1, "mode": "socket", "aeads": [["x"]]},
    {"v": 1, "mode": "nope"}, {1: 1, "mode": "socket"}, [1, "socket"],
    {"v": 1, "mode": "socket", "tickets": 5}, {"v": 1, "mode": "socket", "tickets": -1},
    {"v": 1, "mode": "socket", "tickets": "3"}, {"v": 1, "mode": "socket", "tickets": True},
])
def test_a_malformed_request_is_a_breach(body):
    with pytest.raises(HandshakeBreach):
        decode_request(msgpack.packb(body, use_bin_type=True))


@pytest.mark.parametrize("tickets", [
    b"a" * 32, [b"short"], [bytes([n]) * 32 for n in range(5)], ["a" * 32], [b"a" * 32, b"a" * 32],
    [b"t" * 32],  # the offer's own token again: its channel's key would be used twice
])
def test_an_offer_with_malformed_tickets_is_a_breach(tickets):
    body = {"v": 1, "port": 9, "token": b"t" * 32, "secret": b"s" * 32, "aead": "x", "tickets": tickets,
            "ticket_s": 300}
    with pytest.raises(HandshakeBreach, match="tickets"):
        decode_offer(msgpack.packb(body, use_bin_type=True))


@pytest.mark.parametrize("ticket_s", [0, -5, 3601, 1.5, "300", None])
def test_an_offer_with_tickets_must_state_a_sane_lifetime(ticket_s):
    body = {"v": 1, "port": 9, "token": b"t" * 32, "secret": b"s" * 32, "aead": "x", "tickets": [b"a" * 32],
            "ticket_s": ticket_s}
    with pytest.raises(HandshakeBreach, match="lifetime"):
        decode_offer(msgpack.packb(body, use_bin_type=True))


def test_size_is_checked_before_decoding():
    with pytest.raises(HandshakeBreach, match="exceeds"):
        decode_offer(b"\x80" * (MAX_MESSAGE + 1))


def _mutations():
    seeds = [encode_offer(OFFER), encode_request(REQUEST)]
    flips = st.lists(st.tuples(st.integers(0, 200), st.integers(0, 255)), max_size=6)
    return st.one_of(st.binary(max_size=MAX_MESSAGE + 8),
                     st.tuples(st.sampled_from(seeds), flips).map(lambda sf: _apply(*sf)))


def _apply(seed, flips):
    data = bytearray(seed)
    for pos, byte in flips:
        data[pos % len(data)] = byte
    return bytes(data)


@settings(max_examples=400, deadline=None)
@given(_mutations())
def test_fuzzed_handshake_messages_raise_only_the_projects_error(raw):
    """Mutated handshake bytes either decode into the typed message, with its fields' types, or raise
    HandshakeBreach; any other exception fails the test."""
    for decode, typed in ((decode_offer, ChannelOffer), (decode_request, ChannelRequest)):
        try:
            message = decode(raw)
        except HandshakeBreach:
            continue
        assert isinstance(message, typed)
        if typed is ChannelOffer:
            assert isinstance(message.port, int) and isinstance(message.token, bytes)
            assert isinstance(message.secret, bytes) and isinstance(message.aead, str)
        else:
            assert message.mode in ("socket", "stream")


async def test_a_listener_answering_with_a_wrong_typed_cipher_costs_the_dial_not_the_node():
    """The attack of the issue, against real hosts: the dialer gets one ChannelError and goes on."""
    async def hostile_listener(stream):
        await stream.read(1024)
        raw = msgpack.packb({"v": 1, "port": 9, "token": b"t" * 32, "secret": b"s" * 32, "aead": ["x"]})
        await stream.write(len(raw).to_bytes(2, "big") + raw)
        await stream.close()

    async with open_host() as server_host, open_host() as client_host:
        server_host.set_guarded_handler(PROTOCOL, hostile_listener, timeout=5)
        await client_host.connect(server_host.multiaddrs[0])
        with trio.fail_after(20):
            with pytest.raises(HandshakeBreach, match="cipher"):
                await open_data_channel(client_host, server_host.peer_id, ChannelConfig())
            with pytest.raises(ChannelError):  # and again: each dial fails alone, the host is still there
                await open_data_channel(client_host, server_host.peer_id, ChannelConfig())


async def test_a_listener_granting_more_tickets_than_asked_breaks_the_handshake():
    """A listener cannot fill a dialer's ticket book beyond what the dialer asked for."""
    async def generous_listener(stream):
        await stream.read(1024)
        raw = msgpack.packb({"v": 1, "port": 9, "token": b"t" * 32, "secret": b"s" * 32, "aead": "aes-256-gcm",
                             "tickets": [bytes([n]) * 32 for n in range(3)], "ticket_s": 60})
        await stream.write(len(raw).to_bytes(2, "big") + raw)
        await stream.close()

    async with open_host() as server_host, open_host() as client_host:
        server_host.set_guarded_handler(PROTOCOL, generous_listener, timeout=5)
        await client_host.connect(server_host.multiaddrs[0])
        with trio.fail_after(20):
            with pytest.raises(HandshakeBreach, match="more tickets"):
                await open_data_channel(client_host, server_host.peer_id, ChannelConfig(tickets_per_offer=2))
