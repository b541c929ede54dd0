"""The data channel's record layer (sans-IO) and its stream adapter over a real socket pair, with a hostile peer."""

import os

import pytest
import trio

from p2p.channel.records import (
    AEADS,
    DIALER,
    FINAL,
    HEADER,
    LISTENER,
    MAX_RECORD,
    TAG,
    RecordOpener,
    RecordSealer,
    choose_aead,
    record_buffer,
    split_records,
)
from p2p.channel.stream import SecureChannelStream, StreamTimeouts
from p2p.errors import ChannelError

KEY = bytes(range(32))


def seal(sealer, plaintext, final=False):
    out = record_buffer()
    size = sealer.seal_into(plaintext, out, final=final)
    return bytearray(out[:size])


def open_record(opener, record):
    length, flags = opener.parse_header(record[: HEADER.size])
    assert length == len(record) - HEADER.size
    return opener.open(flags, memoryview(record)[HEADER.size :])


@pytest.mark.parametrize("aead", sorted(AEADS))
def test_records_round_trip_in_order_and_end_with_final(aead):
    sealer, opener = RecordSealer(KEY, DIALER, aead), RecordOpener(KEY, DIALER, aead)
    chunks = [b"", b"x", os.urandom(MAX_RECORD)]
    records = [seal(sealer, c) for c in chunks] + [seal(sealer, b"", final=True)]
    assert [len(r) for r in records[:2]] == [HEADER.size + TAG, HEADER.size + TAG + 1]
    assert [open_record(opener, r) for r in records[:3]] == chunks
    assert open_record(opener, records[3]) == b"" and opener.finished
    with pytest.raises(ChannelError, match="after the peer's final record"):
        opener.parse_header(records[0][: HEADER.size])


@pytest.mark.parametrize("aead", sorted(AEADS))
@pytest.mark.parametrize(
    "attack", ["flip_ciphertext", "flip_flag", "reorder", "replay", "reflect", "wrong_key", "wrong_cipher"]
)
def test_tampered_reordered_replayed_or_reflected_records_fail_authentication(attack, aead):
    sealer = RecordSealer(KEY, DIALER, aead)
    first, second = seal(sealer, b"first record"), seal(sealer, b"second record")
    opener = RecordOpener(KEY, DIALER, aead)
    if attack == "flip_ciphertext":
        first[HEADER.size + 3] ^= 0x01
    elif attack == "flip_flag":
        first[4] ^= FINAL  # a truncation disguised as a clean end
    elif attack == "reorder":
        first = second
    elif attack == "replay":
        assert open_record(opener, first) == b"first record"
    elif attack == "reflect":
        opener = RecordOpener(KEY, LISTENER, aead)  # our own records sent back to us
    elif attack == "wrong_key":
        opener = RecordOpener(bytes(32), DIALER, aead)
    elif attack == "wrong_cipher":
        opener = RecordOpener(KEY, DIALER, next(name for name in AEADS if name != aead))
    with pytest.raises(ChannelError, match="failed authentication"):
        open_record(opener, first)


@pytest.mark.parametrize("aead", sorted(AEADS))
def test_a_record_sealed_from_parts_is_the_record_of_their_concatenation(aead):
    """Several parts are copied into the output and sealed there in place: the record must be exactly the one-shot
    AEAD's record of the joined bytes, so the opener accepts it and nothing else changes."""
    parts = [b"frame header", os.urandom(MAX_RECORD - 100), b"", b"tail" * 20]
    joined = b"".join(parts)
    from_parts, from_join = RecordSealer(KEY, DIALER, aead), RecordSealer(KEY, DIALER, aead)
    opener = RecordOpener(KEY, DIALER, aead)
    for final in (False, True):
        out = record_buffer()
        size = from_parts.seal_parts_into([memoryview(p) for p in parts], out, final=final)
        assert bytes(out[:size]) == bytes(seal(from_join, joined, final=final))
        assert open_record(opener, out[:size]) == joined and opener.finished == final
    with pytest.raises(ValueError):
        RecordSealer(KEY, DIALER, aead).seal_parts_into([bytes(MAX_RECORD), b"x"], record_buffer())


def test_the_listener_offers_its_cipher_only_to_a_dialer_that_lists_it():
    assert choose_aead("aes-256-ocb3", ["aes-256-gcm", "aes-256-ocb3"]) == "aes-256-ocb3"
    assert choose_aead("aes-256-ocb3", None) == "aes-256-gcm"  # an older dialer that lists nothing
    assert choose_aead("aes-256-ocb3", ["chacha20-poly1305"]) == "chacha20-poly1305"
    assert choose_aead("chacha20-poly1305", ["aes-256-gcm", "chacha20-poly1305"]) == "chacha20-poly1305"
    for hostile in ("aes-256-gcm", [b"aes-256-gcm"], {"x": 1}, 7):
        with pytest.raises(ChannelError, match="malformed"):
            choose_aead("aes-256-gcm", hostile)
    with pytest.raises(ChannelError, match="no data channel cipher in common"):
        choose_aead("aes-256-gcm", ["rot13"])


def test_split_records_slices_parts_into_fewest_full_records_without_copying():
    parts = [memoryview(bytes(10)), memoryview(os.urandom(25)), memoryview(bytes(3))]
    groups = list(split_records(parts, limit=16))
    assert [sum(len(v) for v in g) for g in groups] == [16, 16, 6]
    assert b"".join(bytes(v) for g in groups for v in g) == b"".join(bytes(p) for p in parts)
    assert all(any(v.obj is p.obj for p in parts) for g in groups for v in g)  # slices of the parts, no copies
    assert [len(g) for g in groups] == [2, 1, 2]
    head, big, tail = memoryview(b"h" * 5), memoryview(os.urandom(40)), memoryview(b"t" * 3)
    groups = list(split_records([head, big, tail], limit=16, copy_limit=8))  # a big part is never copied with others
    assert [[bytes(v) for v in g] for g in groups] == [
        [b"h" * 5],
        [bytes(big[:16])],
        [bytes(big[16:32])],
        [bytes(big[32:])],
        [b"ttt"],
    ]
    assert list(split_records([memoryview(b"")])) == []


def test_the_aes_mode_a_listener_prefers_is_the_one_measured_fastest_on_this_cpu():
    from p2p.channel.records import AES_256_GCM, AES_256_OCB3, fastest_aead, preferred_aead, record_seconds

    modes = [AES_256_OCB3, AES_256_GCM]
    assert fastest_aead(modes, lambda names: {AES_256_OCB3: 2e-4, AES_256_GCM: 1e-4}) == AES_256_GCM  # AMD EPYC
    assert fastest_aead(modes, lambda names: {AES_256_OCB3: 3e-4, AES_256_GCM: 4e-4}) == AES_256_OCB3  # older Intel
    assert fastest_aead(modes, lambda names: dict.fromkeys(names, 1e-4)) == AES_256_OCB3  # a tie keeps the first
    assert fastest_aead([AES_256_GCM], lambda names: pytest.fail("nothing to compare")) == AES_256_GCM
    seconds = record_seconds(sorted(AEADS), size=4096, rounds=1)
    assert set(seconds) == set(AEADS) and all(0 < s < 1 for s in seconds.values())
    assert preferred_aead() in AEADS and preferred_aead() == preferred_aead()  # measured once, then kept


def test_oversized_or_malformed_headers_are_refused_before_reading_the_body():
    opener = RecordOpener(KEY, DIALER)
    for length, flags in [(MAX_RECORD + TAG + 1, 0), (TAG - 1, 0), (TAG, 0x80)]:
        with pytest.raises(ChannelError, match="malformed"):
            opener.parse_header(HEADER.pack(length, flags))
    with pytest.raises(ValueError):
        RecordSealer(KEY, DIALER).seal_into(bytes(MAX_RECORD + 1), record_buffer())
    with pytest.raises(ChannelError, match="unknown data channel cipher"):
        RecordOpener(KEY, DIALER, "rot13")
    with pytest.raises(ChannelError, match="32 bytes"):
        RecordSealer(KEY[:16], DIALER)


async def socket_pair_streams(timeouts=StreamTimeouts()):
    a, b = trio.socket.socketpair()
    left = SecureChannelStream(
        trio.SocketStream(a), RecordSealer(KEY, DIALER), RecordOpener(KEY, LISTENER), "L", timeouts
    )
    right = SecureChannelStream(
        trio.SocketStream(b), RecordSealer(KEY, LISTENER), RecordOpener(KEY, DIALER), "R", timeouts
    )
    return left, right


async def test_stream_round_trip_bounded_reads_and_clean_eof():
    left, right = await socket_pair_streams()
    data = os.urandom(3 * MAX_RECORD + 12345)
    received = bytearray()

    async def reader():
        while chunk := await right.receive_some(100_000):
            assert len(chunk) <= 100_000
            received.extend(chunk)

    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(reader)
            await left.send_all(data)
            await left.send_eof()
        await right.send_all(b"reply after your eof")
        assert await left.receive_some() == b"reply after your eof"
    assert received == data
    await left.aclose()
    await right.aclose()


async def test_a_piece_frame_is_a_header_record_and_a_payload_record_handed_over_uncopied():
    from p2p.pieces.wire import FrameDecoder, read_frame, write_frame

    left, right = await socket_pair_streams()
    payload = os.urandom(1024 * 1024)
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(write_frame, left, {"t": "piece", "index": 7}, payload)
            header, got = await read_frame(right, FrameDecoder())
    assert header == {"t": "piece", "index": 7} and got == payload
    assert right._opener.index == left._sealer.index == 2  # the payload was sealed from where it lay, not joined
    assert type(got) is bytearray and len(got) == len(payload)  # the decrypted record itself, not a join or slice
    await left.aclose()
    await right.aclose()


async def test_a_channel_starts_with_small_buffers_and_grows_each_once_for_its_first_big_record():
    from p2p.channel.stream import FIRST_BUFFER

    left, right = await socket_pair_streams()
    assert len(left._out) == len(right._in) == FIRST_BUFFER < 200 * 1024  # an idle channel holds little
    records = [os.urandom(100), os.urandom(MAX_RECORD), os.urandom(7), os.urandom(MAX_RECORD)]
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(left.send_parts, [records[0], records[1]])  # the small one rides ahead of the big
            assert [await right.receive_some(), await right.receive_some()] == records[:2]
        grown_out, grown_in = left._out, right._in
        assert len(grown_out) > MAX_RECORD and len(grown_in) > MAX_RECORD
        async with trio.open_nursery() as nursery:
            nursery.start_soon(left.send_parts, [records[2], records[3]])
            assert [await right.receive_some(), await right.receive_some()] == records[2:]
    assert left._out is grown_out and right._in is grown_in  # grown once, then reused
    await left.aclose()
    await right.aclose()


def test_pooled_plaintext_is_reused_only_once_nothing_holds_it():
    from p2p.channel.records import PlaintextPool

    pool = PlaintextPool(per_size=2, sizes=1)
    first = pool.acquire(100)
    held_view = memoryview(pool.acquire(100))  # a view keeps its buffer as busy as the buffer itself
    third = pool.acquire(100)  # both pooled buffers are held: a fresh one, not kept
    assert len({id(first), id(held_view.obj), id(third)}) == 3 and pool.held_bytes == 200
    first_id = id(first)
    del first, third
    again = pool.acquire(100)
    assert id(again) == first_id  # released, so reused
    assert id(pool.acquire(100)) not in (first_id, id(held_view.obj))  # the viewed one stays untouched
    pool.acquire(50)
    assert pool.held_bytes == 50  # only the most recent record sizes are kept


@pytest.mark.parametrize("hold", [True, False])
async def test_records_a_reader_still_holds_are_never_overwritten_by_later_records(hold):
    left, right = await socket_pair_streams()
    records = [os.urandom(MAX_RECORD) for _ in range(6)]
    kept = []
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(left.send_parts, records)
            for expected in records:
                got = await right.receive_some()
                assert got == expected
                if hold:
                    kept.append(got)
                else:
                    kept.append(id(got))
                    del got
    if hold:
        assert kept == records  # every held buffer still reads as it did when it was handed out
    else:
        assert len(set(kept)) < len(records)  # released buffers were reused
    await left.aclose()
    await right.aclose()


async def raw_pair():
    """A sealed-record reader facing a hostile raw socket that we script byte by byte."""
    a, b = trio.socket.socketpair()
    reader = SecureChannelStream(
        trio.SocketStream(b),
        RecordSealer(KEY, LISTENER),
        RecordOpener(KEY, DIALER),
        "hostile",
        StreamTimeouts(record_timeout=5),
    )
    return trio.SocketStream(a), reader


async def test_tampered_record_on_the_wire_ends_the_stream_with_an_error():
    raw, reader = await raw_pair()
    sealer = RecordSealer(KEY, DIALER)
    good, bad = seal(sealer, b"good"), seal(sealer, b"evil")
    bad[-1] ^= 0x40
    await raw.send_all(good + bad)
    with trio.fail_after(5):
        assert await reader.receive_some() == b"good"
        with pytest.raises(ChannelError, match="record 1 failed authentication"):
            await reader.receive_some()
    with pytest.raises(ChannelError, match="broken"):
        await reader.receive_some()  # nothing more is trusted from this peer


@pytest.mark.parametrize("cut", ["between_records", "inside_header", "inside_body"])
async def test_peer_vanishing_mid_transfer_is_an_error_not_a_hang(cut):
    raw, reader = await raw_pair()
    record = seal(RecordSealer(KEY, DIALER), os.urandom(200_000))
    keep = {"between_records": 0, "inside_header": 2, "inside_body": 100_000}[cut]
    await raw.send_all(record[:keep])
    await raw.aclose()  # the process died: FIN without a final record
    with trio.fail_after(5), pytest.raises(ChannelError, match="truncated"):
        await reader.receive_some()


async def test_bytes_read_ahead_are_used_and_a_truncation_inside_them_detected():
    """A read may take up to READ_AHEAD bytes past the record it completes; records packed back to back (small ones
    filling several read-aheads, big ones, empty ones) and split anywhere must still come out exactly, and a stream
    cut inside a header that was read ahead is still a truncation."""
    raw, reader = await raw_pair()
    sealer = RecordSealer(KEY, DIALER)
    chunks = [os.urandom(n) for n in (1, 70_000, 16, 3, *[100] * 800, MAX_RECORD, 7, MAX_RECORD - 1)]
    wire = b"".join(bytes(seal(sealer, c)) for c in chunks) + bytes(seal(sealer, b"lost"))[:3]

    async def send():
        for start in range(0, len(wire), 9_999):  # splits land inside headers, bodies and tags
            await raw.send_all(wire[start : start + 9_999])
        await raw.aclose()

    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(send)
            assert [await reader.receive_some() for _ in chunks] == chunks
            with pytest.raises(ChannelError, match="inside a record header"):
                await reader.receive_some()


class ScriptedSocket:
    """A socket whose peer has sent all of `wire` already: each read takes what fits, and is counted."""

    def __init__(self, wire: bytes) -> None:
        self.wire, self.pos, self.reads = memoryview(wire), 0, 0

    async def recv_into(self, view) -> int:
        await trio.lowlevel.checkpoint()
        self.reads += 1
        size = min(len(view), len(self.wire) - self.pos)
        view[:size] = self.wire[self.pos : self.pos + size]
        self.pos += size
        return size


async def test_a_piece_frames_header_record_comes_with_the_previous_payload_not_in_a_read_of_its_own():
    from types import SimpleNamespace

    from p2p.pieces.wire import FrameDecoder, encode_frame, read_frame

    sealer, pieces = RecordSealer(KEY, DIALER), [os.urandom(MAX_RECORD) for _ in range(8)]
    wire = bytearray()
    for index, piece in enumerate(pieces):
        parts = [memoryview(part).cast("B") for part in encode_frame({"t": "piece", "index": index}, piece)]
        for group in split_records(parts):
            wire += seal(sealer, b"".join(group))
    sock = ScriptedSocket(bytes(wire))
    reader = SecureChannelStream(SimpleNamespace(socket=sock), RecordSealer(KEY, LISTENER), RecordOpener(KEY, DIALER),
                                 "P")
    decoder = FrameDecoder()
    for index, piece in enumerate(pieces):
        header, payload = await read_frame(reader, decoder)
        assert header == {"t": "piece", "index": index} and payload == piece
    assert reader._opener.index == 2 * len(pieces)  # a header record and a payload record per piece
    assert sock.reads <= len(pieces) + 1  # not two reads per piece: the header record comes with the payload


async def test_peer_stalling_inside_a_record_times_out(autojump_clock):
    raw, reader = await raw_pair()
    record = seal(RecordSealer(KEY, DIALER), b"x" * 1000)
    await raw.send_all(record[:500])  # then silence, connection kept open
    start = trio.current_time()
    with pytest.raises(ChannelError, match="stalled"):
        await reader.receive_some()
    assert trio.current_time() - start == pytest.approx(5, abs=0.01)
    await raw.aclose()


def test_channel_config_is_validated_at_the_edge():
    from p2p.channel.service import ChannelConfig

    with pytest.raises(ChannelError, match="handshake_timeout"):
        ChannelConfig(handshake_timeout=0)
    with pytest.raises(ChannelError, match="unknown data channel cipher"):
        ChannelConfig(aead="des")
    assert ChannelConfig(aead="chacha20-poly1305").aead == "chacha20-poly1305"


async def test_data_sockets_get_tcp_keepalive_so_a_vanished_machine_is_detected():
    import socket

    from p2p.channel.stream import tune_socket

    listener = (await trio.open_tcp_listeners(0, host="127.0.0.1"))[0]
    client = await trio.open_tcp_stream("127.0.0.1", listener.socket.getsockname()[1])
    tune_socket(client, 0)
    assert client.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) == 1
    if hasattr(socket, "TCP_KEEPIDLE"):
        assert client.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE) == 30
    await client.aclose()
    await listener.aclose()


async def test_grown_buffers_shrink_back_once_the_channel_idles_and_grow_again_on_demand(autojump_clock):
    """An idle link, or a stranger's channel that sent one big record, must not keep 2.3 MiB of buffers for good."""
    from p2p.channel.stream import FIRST_BUFFER, SHRINK_AFTER

    left, right = await socket_pair_streams()
    big = [os.urandom(MAX_RECORD), os.urandom(MAX_RECORD)]
    async with trio.open_nursery() as nursery:
        nursery.start_soon(left.send_all, big[0])
        assert await right.receive_some() == big[0]
    assert len(right._in) > MAX_RECORD and len(left._out) > MAX_RECORD
    async with trio.open_nursery() as nursery:
        nursery.start_soon(right.receive_some)  # waits for a next record that comes only after the idle time
        await trio.sleep(SHRINK_AFTER + 1)
        assert len(right._in) == FIRST_BUFFER and right._pool.held_bytes == 0
        nursery.cancel_scope.cancel()
    async with trio.open_nursery() as nursery:  # the next big record grows the buffer again, intact
        nursery.start_soon(left.send_all, big[1])
        assert await right.receive_some() == big[1]
    await left.aclose()
    await right.aclose()
