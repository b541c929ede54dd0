"""The buffered pubsub reader: the RPCs py-libp2p parses out of it are exactly those sent, split anywhere, from far
fewer reads of the underlying stream; EOF, errors and every other attribute pass through."""

from __future__ import annotations

import pytest
import trio
from libp2p.utils.varint import encode_varint_prefixed, read_varint_prefixed_bytes_limited

from p2p.gossip.pubsub import BufferedInboundStream


class ScriptedStream:
    """A stream whose reads return the scripted pieces in order (each cut to the size asked), then b""."""

    def __init__(self, pieces: list[bytes], fail: Exception | None = None) -> None:
        self.pieces = list(pieces)
        self.fail = fail
        self.reads = 0
        self.muxed_conn = "the connection"
        self.was_reset = False

    async def read(self, n: int | None = -1) -> bytes:
        self.reads += 1
        await trio.lowlevel.checkpoint()
        if not self.pieces:
            if self.fail is not None:
                raise self.fail
            return b""
        piece = self.pieces.pop(0)
        if n is not None and 0 <= n < len(piece):
            piece, rest = piece[:n], piece[n:]
            self.pieces.insert(0, rest)
        return piece

    async def reset(self) -> None:
        self.was_reset = True


def _messages() -> list[bytes]:
    return [bytes([i]) * size for i, size in enumerate([1, 127, 128, 300, 5000, 70_000, 3])]


async def _read_all(stream, count: int) -> list[bytes]:
    return [await read_varint_prefixed_bytes_limited(stream, 1 << 20) for _ in range(count)]


@pytest.mark.parametrize("cut", [1, 7, 4096, 10**6])
async def test_rpcs_come_out_whole_wherever_the_bytes_were_split(cut):
    wire = b"".join(encode_varint_prefixed(m) for m in _messages())
    raw = ScriptedStream([wire[i : i + cut] for i in range(0, len(wire), cut)])
    assert await _read_all(BufferedInboundStream(raw), len(_messages())) == _messages()


async def test_small_rpcs_cost_one_read_of_the_stream_not_one_per_varint_byte():
    messages = [bytes([i]) * 200 for i in range(50)]  # two varint bytes each: three reads each unbuffered
    wire = b"".join(encode_varint_prefixed(m) for m in messages)
    unbuffered, buffered = ScriptedStream([wire]), ScriptedStream([wire])
    assert await _read_all(unbuffered, 50) == messages
    assert await _read_all(BufferedInboundStream(buffered), 50) == messages
    assert unbuffered.reads == 150
    assert buffered.reads == 1


async def test_eof_and_errors_reach_the_reader_after_the_buffered_bytes():
    wire = encode_varint_prefixed(b"last")
    done = BufferedInboundStream(ScriptedStream([wire + b"\x05ab"]))
    assert await read_varint_prefixed_bytes_limited(done, 100) == b"last"
    with pytest.raises(Exception, match="Incomplete message"):  # a body cut short by EOF, as unbuffered
        await read_varint_prefixed_bytes_limited(done, 100)
    broken = BufferedInboundStream(ScriptedStream([wire], fail=ConnectionResetError("gone")))
    assert await read_varint_prefixed_bytes_limited(broken, 100) == b"last"
    with pytest.raises(ConnectionResetError):
        await broken.read(1)


async def test_read_everything_hands_over_the_buffer_first_and_other_calls_pass_through():
    raw = ScriptedStream([b"abcdef", b"ghi"])
    stream = BufferedInboundStream(raw)
    assert await stream.read(2) == b"ab"
    assert await stream.read(-1) == b"cdef"
    assert await stream.read(None) == b"ghi"
    assert stream.muxed_conn == "the connection"
    await stream.reset()
    assert raw.was_reset
