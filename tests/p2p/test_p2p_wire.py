"""Piece-protocol framing: round trips, limits, truncation, and fuzzing of the decoder with hostile bytes."""

from __future__ import annotations

import msgpack
import pytest
import trio
import trio.testing
from hypothesis import example, given, settings
from hypothesis import strategies as st

from p2p.errors import FrameError
from p2p.pieces.wire import (
    Bitfield,
    Cancel,
    FrameDecoder,
    Have,
    Hello,
    Piece,
    Reject,
    Request,
    encode_frame,
    message_frame,
    pack_bits,
    parse_message,
    read_frame,
    unpack_bits,
    write_frame,
)


def _joined(parts) -> bytes:
    return b"".join(bytes(p) for p in parts)


def test_round_trip_every_message_type_byte_by_byte():
    msgs = [
        Hello(b"\x01" * 32, pack_bits([1, 0, 1])),
        Bitfield(pack_bits([0, 1, 1])),
        Have(2),
        Request(0),
        Cancel(1),
        Piece(2, b"\x00payload" * 20000),
        Reject(1, "busy"),
    ]
    stream = b"".join(_joined(message_frame(m)) for m in msgs)
    dec = FrameDecoder()
    out = []
    for i in range(len(stream)):  # worst case for reassembly: one byte at a time
        dec.feed(stream[i : i + 1])
        while (frame := dec.next_frame()) is not None:
            out.append(parse_message(*frame, num_pieces=3))
    dec.eof()
    assert out == msgs


def test_large_payload_is_not_copied_into_the_header_buffer():
    payload = bytearray(b"z" * (1 << 20))
    parts = encode_frame({"t": "piece", "index": 0}, payload)
    assert len(parts) == 2 and isinstance(parts[1], memoryview) and parts[1].obj is payload


def test_oversized_payload_is_refused_before_the_body_arrives():
    dec = FrameDecoder(max_payload=1000)
    head = msgpack.packb({"t": "piece", "index": 0})
    dec.feed(len(head).to_bytes(4, "big") + head + (1001).to_bytes(4, "big"))
    with pytest.raises(FrameError, match="exceeds"):
        dec.next_frame()


def test_oversized_header_is_refused_both_ways():
    with pytest.raises(FrameError):
        encode_frame({"t": "x", "junk": b"a" * (70 * 1024)})
    dec = FrameDecoder()
    dec.feed((65 * 1024 + 1).to_bytes(4, "big"))
    with pytest.raises(FrameError):
        dec.next_frame()


def test_truncated_frame_at_eof_raises():
    data = _joined(encode_frame({"t": "piece", "index": 0}, b"abc" * 1000))
    dec = FrameDecoder()
    dec.feed(data[:-1])
    assert dec.next_frame() is None
    with pytest.raises(FrameError, match="ended inside"):
        dec.eof()


@pytest.mark.parametrize(
    "header,payload,num",
    [
        ({"t": "have", "index": 5}, b"", 5),  # index out of range
        ({"t": "have", "index": -1}, b"", 5),
        ({"t": "have", "index": True}, b"", 5),  # bool is not an index
        ({"t": "request", "index": "1"}, b"", 5),
        ({"t": "have", "index": 1}, b"x", 5),  # control message with payload
        ({"t": "hello", "manifest_id": b"short", "bitfield": b"\x00"}, b"", 5),
        ({"t": "bitfield", "bits": b"\x00\x00"}, b"", 5),  # wrong length
        ({"t": "bitfield", "bits": b"\x04"}, b"", 5),  # bit past the last piece
        ({"t": "reject", "index": 0, "reason": 7}, b"", 5),
        ({"t": "bogus"}, b"", 5),
    ],
)
def test_parse_message_rejects_malformed_headers(header, payload, num):
    with pytest.raises(FrameError):
        parse_message(header, payload, num)


def test_bitfield_pack_unpack_round_trip():
    flags = [1, 0, 0, 1, 1, 0, 1, 0, 1, 1, 0]
    assert list(unpack_bits(pack_bits(flags), len(flags))) == flags
    assert pack_bits(flags)[0] == 0b10011010


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=2048), st.integers(min_value=1, max_value=64))
@example(b"".join(bytes(p) for p in encode_frame({"t": "piece", "index": 16}, b"xyz")), 2)
def test_garbage_never_raises_anything_but_frame_error(data, step):
    dec = FrameDecoder(max_header=512, max_payload=1024)
    try:
        for i in range(0, len(data), step):
            dec.feed(data[i : i + step])
            while (frame := dec.next_frame()) is not None:
                _assert_canonical(parse_message(*frame, num_pieces=17), num_pieces=17)
        dec.eof()
    except FrameError:
        pass


def _assert_canonical(msg, num_pieces: int) -> None:
    """Whatever the decoder accepts is a well-formed message: it re-encodes and parses back to itself."""
    dec = FrameDecoder()
    dec.feed(b"".join(bytes(part) for part in message_frame(msg)))
    again = parse_message(*dec.next_frame(), num_pieces=num_pieces)
    assert type(again) is type(msg) and again == msg and dec.buffered == 0


@settings(max_examples=200, deadline=None)
@given(
    st.dictionaries(
        st.text(max_size=5),
        st.recursive(
            st.none() | st.integers(-(2**63), 2**64 - 1) | st.binary(max_size=8),
            lambda c: st.lists(c, max_size=3),
            max_leaves=8,
        ),
        max_size=4,
    )
)
@example({"t": "have", "index": 3})  # accepted shapes too: each must re-encode to itself
@example({"t": "hello", "manifest_id": b"m" * 32, "bitfield": b"\xff\x80"})
def test_valid_msgpack_with_arbitrary_shapes_only_raises_frame_error(header):
    raw = msgpack.packb(header)
    dec = FrameDecoder()
    dec.feed(len(raw).to_bytes(4, "big") + raw + b"\x00\x00\x00\x00")
    try:
        frame = dec.next_frame()
        _assert_canonical(parse_message(*frame, num_pieces=9), num_pieces=9)
    except FrameError:
        pass


async def test_read_and_write_frames_over_a_trio_stream():
    left, right = trio.testing.memory_stream_pair()
    dec = FrameDecoder()
    async with trio.open_nursery() as nursery:

        async def sender():
            await write_frame(left, {"t": "piece", "index": 1}, b"q" * 300_000)
            await write_frame(left, {"t": "have", "index": 2})
            await left.aclose()

        nursery.start_soon(sender)
        h1, p1 = await read_frame(right, dec)
        h2, p2 = await read_frame(right, dec)
        assert (h1, len(p1), h2, p2) == ({"t": "piece", "index": 1}, 300_000, {"t": "have", "index": 2}, b"")
        assert await read_frame(right, dec) is None


def test_stream_ending_right_after_a_frame_prefix_is_truncation():
    dec = FrameDecoder()
    dec.feed(_joined(encode_frame({"t": "piece", "index": 0}, b"abc"))[:-3])  # header and length, no payload
    assert dec.next_frame() is None
    with pytest.raises(FrameError):
        dec.eof()


def test_payload_split_across_many_feeds_is_reassembled_exactly():
    payload = bytes(range(256)) * 4096
    data = _joined(encode_frame({"t": "piece", "index": 3}, payload)) * 2
    dec = FrameDecoder()
    frames = []
    for i in range(0, len(data), 7777):
        dec.feed(data[i : i + 7777])
        while (f := dec.next_frame()) is not None:
            frames.append(f)
    dec.eof()
    assert [(h["index"], bytes(p)) for h, p in frames] == [(3, payload), (3, payload)]


def test_payload_arriving_as_one_chunk_is_handed_out_uncopied():
    payload = bytes(range(256)) * 4096
    prefix, body = encode_frame({"t": "piece", "index": 1}, payload)
    dec = FrameDecoder()
    dec.feed(prefix)
    assert dec.next_frame() is None
    chunk = bytes(body)
    dec.feed(chunk)
    header, got = dec.next_frame()
    assert header == {"t": "piece", "index": 1} and got is chunk and dec.buffered == 0


def test_fed_memoryview_is_copied_so_its_owner_may_reuse_the_buffer():
    raw = bytearray(_joined(encode_frame({"t": "piece", "index": 0}, b"abc" * 100)))
    dec = FrameDecoder()
    dec.feed(memoryview(raw)[:50])
    raw[:50] = bytes(50)  # the owner reuses its buffer
    dec.feed(memoryview(raw)[50:])
    header, payload = dec.next_frame()
    assert header == {"t": "piece", "index": 0} and payload == b"abc" * 100


def test_frames_inside_one_chunk_are_views_of_it_not_copies():
    """The data channel seals a whole frame (or several) into one record: payloads must come out as views of it."""
    first, second = bytes(range(256)) * 4096, b"second payload" * 10_000
    chunk = _joined(encode_frame({"t": "piece", "index": 1}, first) + encode_frame({"t": "piece", "index": 2}, second))
    dec = FrameDecoder()
    dec.feed(chunk)
    (h1, p1), (h2, p2) = dec.next_frame(), dec.next_frame()
    assert (h1["index"], h2["index"]) == (1, 2) and dec.next_frame() is None and dec.buffered == 0
    assert isinstance(p1, memoryview) and p1.obj is chunk and p1 == first
    assert isinstance(p2, memoryview) and p2.obj is chunk and p2 == second
    assert parse_message(h1, p1, num_pieces=3) == Piece(1, first)


async def test_write_frame_hands_a_packing_stream_the_whole_frame_in_one_call():
    class Packer:
        def __init__(self):
            self.calls = []

        async def send_parts(self, parts):
            self.calls.append(_joined(parts))

    payload = b"p" * 100_000
    stream = Packer()
    await write_frame(stream, {"t": "piece", "index": 4}, payload)
    assert stream.calls == [_joined(encode_frame({"t": "piece", "index": 4}, payload))]
