"""The data channel's handshake messages as frozen values, each with one decoder that raises only ChannelError.

Rules of this module: bytes in, typed values out, no IO. A message is at most MAX_MESSAGE bytes; its size is checked
before msgpack sees a byte, and msgpack itself is bounded (string, binary, array and map lengths), so no input can
make a decoder allocate more than a few KiB or raise anything but `HandshakeBreach`. Handlers use the values, never
the raw maps: a field of the wrong type (a list where a cipher name belongs) is refused here, since deeper in the
dialer it would raise a TypeError that nothing expects, and that would end the whole node.

    request (dialer -> listener)   {"v": 1, "mode": "socket" | "stream", "aeads": [names], "tickets": int}
    offer   (listener -> dialer)   {"v": 1, "port": int, "token": 32 B, "secret": 32 B, "aead": name,
                                    "tickets": [32 B, ...], "ticket_s": int}

"aeads", "tickets" and "ticket_s" are optional: a peer that knows no tickets neither asks for them nor grants any
(p2p.channel.tickets says what a ticket is).
"""

from __future__ import annotations

from dataclasses import dataclass

import msgpack

from p2p.errors import ChannelError
from p2p.packed import Packed

VERSION = 1
MAX_MESSAGE = 1024
"""Largest handshake message in bytes; the offer is about 120."""
TOKEN_BYTES = 32
SECRET_BYTES = 32
MAX_AEADS = 16
"""Cipher names a request may list."""
MAX_NAME = 32
MAX_TICKETS = 4
"""Tickets a request may ask for and an offer may carry."""
MAX_TICKET_S = 3600
"""Longest ticket lifetime an offer may state, in seconds."""
MODES = ("socket", "stream")


class HandshakeBreach(ChannelError):
    """A handshake message broke the format (oversized, not msgpack, a field missing or of the wrong type): the
    peer that sent it is breaking the protocol, not merely leaving."""


@dataclass(frozen=True)
class ChannelRequest:
    """What a dialer asks for: the data socket (and the ciphers it supports) or the libp2p stream itself."""

    mode: str
    """"socket": an offer for the fast data socket; "stream": the libp2p stream becomes the data channel."""
    aeads: tuple[str, ...] | None
    """Cipher names the dialer supports; None when it listed none (a dialer that knows only the legacy pair)."""
    tickets: int = 0
    """Extra one-time tokens the dialer asks for, each good for one more channel without a handshake (socket mode)."""


@dataclass(frozen=True)
class ChannelOffer:
    """The listener's answer to a socket request: where to connect, the one-time token and the record secret."""

    port: int
    token: bytes
    secret: bytes
    aead: str
    """Cipher name the listener chose; the dialer checks it is one it supports."""
    tickets: tuple[bytes, ...] = ()
    """Extra one-time tokens, at most as many as asked for (p2p.channel.tickets)."""
    ticket_s: int = 0
    """Seconds the tickets stay valid from the offer on."""


def encode_request(request: ChannelRequest) -> bytes:
    body: dict[str, Packed] = {"v": VERSION, "mode": request.mode}
    if request.aeads is not None:
        body["aeads"] = list(request.aeads)
    if request.tickets:
        body["tickets"] = request.tickets
    return _pack(body)


def encode_offer(offer: ChannelOffer) -> bytes:
    body = {"v": VERSION, "port": offer.port, "token": offer.token, "secret": offer.secret, "aead": offer.aead}
    if offer.tickets:
        body["tickets"], body["ticket_s"] = list(offer.tickets), offer.ticket_s
    return _pack(body)


def decode_request(raw: bytes) -> ChannelRequest:
    """A dialer's request, validated; HandshakeBreach for anything else."""
    body = _unpack(raw)
    mode = body.get("mode")
    if mode not in MODES:
        raise HandshakeBreach(f"data channel request names an unknown mode {_shown(mode)}")
    tickets = body.get("tickets", 0)
    if type(tickets) is not int or not 0 <= tickets <= MAX_TICKETS:
        raise HandshakeBreach(f"data channel request asks for {_shown(tickets)} tickets (0 to {MAX_TICKETS})")
    aeads = body.get("aeads")
    if aeads is None:
        return ChannelRequest(mode, None, tickets)
    if not isinstance(aeads, list) or len(aeads) > MAX_AEADS or not all(_is_name(a) for a in aeads):
        raise HandshakeBreach("data channel request lists its ciphers in a malformed way")
    return ChannelRequest(mode, tuple(aeads), tickets)


def decode_offer(raw: bytes) -> ChannelOffer:
    """A listener's offer, validated; HandshakeBreach for anything else."""
    body = _unpack(raw)
    port, token, secret, aead = body.get("port"), body.get("token"), body.get("secret"), body.get("aead")
    if type(port) is not int or not 0 < port < 65536:
        raise HandshakeBreach("data channel offer has no valid port")
    if not (isinstance(token, bytes) and len(token) == TOKEN_BYTES):
        raise HandshakeBreach("data channel offer has no valid token")
    if not (isinstance(secret, bytes) and len(secret) == SECRET_BYTES):
        raise HandshakeBreach("data channel offer has no valid secret")
    if not _is_name(aead):
        raise HandshakeBreach("data channel offer names its cipher in a malformed way")
    tickets, ticket_s = body.get("tickets", []), body.get("ticket_s", 0)
    if (not isinstance(tickets, list) or len(tickets) > MAX_TICKETS
            or not all(isinstance(t, bytes) and len(t) == TOKEN_BYTES for t in tickets)
            or len({token, *tickets}) != len(tickets) + 1):  # a token used twice would reuse a channel's key
        raise HandshakeBreach("data channel offer carries its tickets in a malformed way")
    if type(ticket_s) is not int or not (0 < ticket_s <= MAX_TICKET_S if tickets else ticket_s == 0):
        raise HandshakeBreach(f"data channel offer states a ticket lifetime of {_shown(ticket_s)} s")
    return ChannelOffer(port, token, secret, aead, tuple(tickets), ticket_s)


def _is_name(value: object) -> bool:
    return isinstance(value, str) and 0 < len(value) <= MAX_NAME


def _shown(value: object) -> str:
    """A hostile value named in a log line, never longer than a few dozen characters."""
    return repr(value)[:40]


def _pack(body: dict[str, Packed]) -> bytes:
    raw = msgpack.packb(body, use_bin_type=True)
    if len(raw) > MAX_MESSAGE:
        raise ChannelError(f"data channel handshake message of {len(raw)} bytes exceeds {MAX_MESSAGE}")
    return raw


def _unpack(raw: bytes) -> dict[str, Packed]:
    """The message's map with string keys and version 1; bounded before and while decoding."""
    if len(raw) > MAX_MESSAGE:
        raise HandshakeBreach(f"data channel handshake message of {len(raw)} bytes exceeds {MAX_MESSAGE}")
    try:
        body = msgpack.unpackb(raw, raw=False, strict_map_key=True, max_str_len=MAX_MESSAGE, max_bin_len=MAX_MESSAGE,
                               max_array_len=MAX_AEADS, max_map_len=16, max_ext_len=0)
    except Exception as exc:  # noqa: BLE001 - msgpack raises a dozen types for garbage; all mean the same
        raise HandshakeBreach(f"data channel handshake message is not valid msgpack ({type(exc).__name__})") from exc
    if not isinstance(body, dict) or type(body.get("v")) is not int or body.get("v") != VERSION:
        raise HandshakeBreach("data channel handshake message is not a version-1 map")
    return body
