"""Fuzz decoders and samples for what arrives on streams rather than in gossip: piece-protocol frames, the data
channel's handshake (request and offer), the link preamble's head and the data channel's records.

Each decoder reads its input the way the receiving side does, through the same framing and the same typed
decoder (p2p.pieces.wire, p2p.channel.messages, swarm.policy.link_preamble, p2p.channel.records), so a finding here is a
crash of that receiver. The registry that lists them, and the property they must hold, is swarm.bench.fuzz_targets.
"""

from __future__ import annotations

import functools
import struct
from collections.abc import Coroutine
from typing import TypeVar

import msgpack

from p2p.channel.config import ChannelConfig
from p2p.channel.handshake import read_msg
from p2p.channel.messages import ChannelOffer, HandshakeBreach, decode_offer, decode_request
from p2p.channel.records import (
    AEADS,
    AES_256_GCM,
    CHACHA20_POLY1305,
    HEADER,
    LISTENER,
    RecordOpener,
    RecordSealer,
    choose_aead,
    record_buffer,
)
from p2p.errors import ChannelError
from p2p.pieces.wire import (
    Bitfield,
    Cancel,
    Have,
    Hello,
    Piece,
    Reject,
    Request,
    decode_frames,
    message_frame,
    pack_bits,
)
from swarm.policy.link_preamble import PreambleHead, decode_head

T = TypeVar("T")
FRAME_PIECES = 20
CHANNEL_KEY = bytes(range(100, 132))


# ---------------------------------------------------------------------------------------------- piece frames


def decode_piece_frames(data: bytes) -> list:
    """Every frame of a piece-protocol byte stream, parsed against a 20-piece manifest, then the end of stream."""

    return decode_frames(data, FRAME_PIECES)


@functools.cache
def frame_samples() -> list[bytes]:
    bits = pack_bits([i % 3 == 0 for i in range(FRAME_PIECES)])
    messages = [Hello(b"\x03" * 32, bits), Bitfield(bits), Have(4), Request(19), Cancel(0), Reject(3, "busy"),
                Piece(2, b"\xab" * 300)]
    streams = [b"".join(bytes(part) for part in message_frame(m)) for m in messages]
    return streams + [b"".join(streams)]


# ---------------------------------------------------------------------------------------------- data channel handshake


class _ReplayStream:
    """The read side of a libp2p stream over fixed bytes, for driving a handshake reader without trio."""

    def __init__(self, data: bytes) -> None:
        self.data = data

    async def read(self, n: int) -> bytes:
        chunk, self.data = self.data[:n], self.data[n:]
        return chunk


def _run_without_io(coroutine: Coroutine[object, None, T]) -> T:
    """Run a coroutine that never waits on anything (its stream answers at once) to its end."""
    try:
        coroutine.send(None)
    except StopIteration as done:
        return done.value
    coroutine.close()
    raise RuntimeError("the handshake reader waited on something other than its stream")


def _handshake(msg: dict) -> bytes:
    raw = msgpack.packb(msg, use_bin_type=True)
    return struct.pack(">H", len(raw)) + raw


def decode_channel_request(data: bytes) -> str:
    """A dialer's request as the listener reads it (p2p.channel.service's _handle_handshake and _make_offer): one
    length-prefixed message, its typed decoder, then the cipher the listener may offer."""

    request = decode_request(_run_without_io(read_msg(_ReplayStream(data), opening=True)))
    return choose_aead(AES_256_GCM, None if request.aeads is None else list(request.aeads))


@functools.cache
def channel_request_samples() -> list[bytes]:
    return [_handshake({"v": 1, "mode": "socket", "aeads": sorted(AEADS)}), _handshake({"v": 1, "mode": "socket"}),
            _handshake({"v": 1, "mode": "stream"}), _handshake({"v": 1, "mode": "socket", "tickets": 3})]


def decode_channel_offer(data: bytes) -> ChannelOffer:
    """A listener's offer as the dialer reads it (p2p.channel.service's _request_offer): one length-prefixed message,
    its typed decoder, then the checks that the cipher is one the dialer listed and the tickets no more than it
    asked."""

    offer = decode_offer(_run_without_io(read_msg(_ReplayStream(data))))
    if offer.aead not in AEADS:
        raise HandshakeBreach("data channel offer names a cipher the dialer did not list")
    if len(offer.tickets) > ChannelConfig().tickets_per_offer:
        raise HandshakeBreach("data channel offer carries more tickets than the dialer asked for")
    return offer


@functools.cache
def channel_offer_samples() -> list[bytes]:
    return [*(_handshake({"v": 1, "port": 40123, "token": b"\x01" * 32, "secret": b"\x02" * 32, "aead": name})
              for name in (AES_256_GCM, CHACHA20_POLY1305)),
            _handshake({"v": 1, "port": 40123, "token": b"\x01" * 32, "secret": b"\x02" * 32, "aead": AES_256_GCM,
                        "tickets": [b"\x03" * 32, b"\x04" * 32], "ticket_s": 300})]


# ---------------------------------------------------------------------------------------------- link preamble


def decode_preamble_head(data: bytes) -> PreambleHead:
    """The fixed head of a mirror link's preamble (route and declared manifest size), as the acceptor decodes it
    before it reads or budgets a byte of the manifest; the manifest itself is the signed-manifest target's."""

    return decode_head(data)


@functools.cache
def preamble_head_samples() -> list[bytes]:
    return [b"\x05" * 32 + size.to_bytes(4, "big") for size in (0, 2_100, 64 << 10)]


# ---------------------------------------------------------------------------------------------- data channel records


def decode_channel_records(data: bytes) -> list:
    """Records of one data-channel direction: each header checked, each body authenticated and opened, in order."""

    opener, out, view = RecordOpener(CHANNEL_KEY, LISTENER), [], memoryview(data)
    while len(view) >= HEADER.size:
        length, flags = opener.parse_header(view[: HEADER.size])
        body = view[HEADER.size : HEADER.size + length]
        if len(body) < length:
            raise ChannelError("data channel ended inside a record")
        out.append(bytes(opener.open(flags, body)))
        view = view[HEADER.size + length :]
    return out


@functools.cache
def channel_record_samples() -> list[bytes]:
    sealer, buf, records = RecordSealer(CHANNEL_KEY, LISTENER), record_buffer(), []
    for chunk, final in ((b"hello", False), (b"\x00" * 3000, False), (b"", True)):
        size = sealer.seal_into(chunk, buf, final)
        records.append(bytes(buf[:size]))
    return [b"".join(records)]
