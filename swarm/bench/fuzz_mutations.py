"""Mutations of valid encodings into hostile ones, for the decoder fuzzing of swarm.bench.fuzz_targets.

Why mutate valid encodings instead of drawing random bytes: random bytes die at the first length or type check,
while a valid message changed in one place reaches the checks deep inside a decoder (a tensor entry of a signed
manifest, one completion of a rollout group). Two families: byte edits (flips, truncation, insertion, splicing),
and edits of the decoded msgpack tree (a value swapped for one of another type, huge, negative or NaN numbers,
deep nesting, oversized containers, keys dropped or added) that are encoded again. Every mutation takes a
`random.Random`, so the bench draws from a seeded one and the tests from hypothesis's, which it can replay.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable

import msgpack

from p2p.packed import Packed

MAX_INPUT_BYTES = 1 << 20
"""Largest mutated input handed to a decoder: room for every limit to be exceeded, small enough to stay fast."""

_MARKERS = bytes([0x00, 0x7F, 0x80, 0x8F, 0x90, 0x9F, 0xC0, 0xC1, 0xC2, 0xC3, 0xC4, 0xC5, 0xC6, 0xCA, 0xCB, 0xCC,
                  0xCF, 0xD0, 0xD3, 0xD9, 0xDB, 0xDC, 0xDD, 0xDE, 0xDF, 0xE0, 0xFF])
"""Bytes that mean something to msgpack: type tags, container and length markers, the never-used 0xC1."""


def _nested(depth: int, leaf: Packed = None) -> Packed:
    value = leaf
    for _ in range(depth):
        value = [value]
    return value


HOSTILE_VALUES: tuple[Callable[[random.Random], Packed], ...] = (
    lambda r: None,
    lambda r: True,
    lambda r: False,
    lambda r: 0,
    lambda r: -1,
    lambda r: r.choice((2**63 - 1, 2**64 - 1, -(2**63), 2**31, -(2**31) - 1, 2**53 + 1)),
    lambda r: r.choice((math.nan, math.inf, -math.inf, -0.0, 1e308, 5e-324, 0.5)),
    lambda r: "",
    lambda r: r.choice(("x" * r.randrange(1, 5000), "\x00\n\x1b[2J", "../../etc/passwd", "é" * 300)),
    lambda r: b"",
    lambda r: bytes(r.randrange(256) for _ in range(r.choice((1, 31, 32, 33, 64)))),
    lambda r: [],
    lambda r: {},
    lambda r: [None] * r.choice((1, 1000, 70000)),
    lambda r: {i: i for i in range(r.choice((1, 100, 5000)))},
    lambda r: {b"k": 1, "k": 2, 3: 4},
    lambda r: _nested(r.choice((17, 33, 100, 500))),
    lambda r: [[] for _ in range(r.choice((10, 10000)))],
)


def hostile_value(rng: random.Random) -> Packed:
    """One value of a shape decoders trip over."""
    return rng.choice(HOSTILE_VALUES)(rng)


# ---------------------------------------------------------------------------------------------- byte edits


def flip_bits(data: bytes, rng: random.Random) -> bytes:
    out = bytearray(data)
    for _ in range(rng.randrange(1, 4)):
        if out:
            out[rng.randrange(len(out))] ^= 1 << rng.randrange(8)
    return bytes(out)


def set_byte(data: bytes, rng: random.Random) -> bytes:
    if not data:
        return bytes([rng.choice(_MARKERS)])
    out = bytearray(data)
    out[rng.randrange(len(out))] = rng.choice(_MARKERS) if rng.random() < 0.6 else rng.randrange(256)
    return bytes(out)


def truncate(data: bytes, rng: random.Random) -> bytes:
    return data[: rng.randrange(len(data) + 1)]


def drop_range(data: bytes, rng: random.Random) -> bytes:
    if not data:
        return data
    start = rng.randrange(len(data))
    return data[:start] + data[start + rng.randrange(1, 64) :]


def insert_bytes(data: bytes, rng: random.Random) -> bytes:
    at = rng.randrange(len(data) + 1)
    filler = bytes(rng.choice(_MARKERS) for _ in range(rng.randrange(1, 9)))
    return data[:at] + filler + data[at:]


def duplicate_range(data: bytes, rng: random.Random) -> bytes:
    if not data:
        return data
    start = rng.randrange(len(data))
    chunk = data[start : start + rng.randrange(1, 256)]
    return data[:start] + chunk * rng.randrange(2, 5) + data[start:]


def set_length(data: bytes, rng: random.Random) -> bytes:
    """Overwrite four bytes with a big-endian length: the framing of every stream protocol here."""
    if len(data) < 4:
        return data
    at = rng.randrange(len(data) - 3)
    value = rng.choice((0, 1, 2**31, 2**32 - 1, len(data), len(data) + 1, rng.randrange(2**32)))
    return data[:at] + value.to_bytes(4, "big") + data[at + 4 :]


BYTE_EDITS = (flip_bits, set_byte, truncate, drop_range, insert_bytes, duplicate_range, set_length)


# ---------------------------------------------------------------------------------------------- tree edits


def _containers(tree: Packed, depth: int = 0) -> list[list[Packed] | dict[Packed, Packed]]:
    """Every map and list inside `tree` (bounded, so a sample's piece-hash lists do not dominate)."""
    found: list[list[Packed] | dict[Packed, Packed]] = []
    pending = [(tree, depth)]
    while pending and len(found) < 4096:
        node, d = pending.pop()
        if isinstance(node, (dict, list)):
            found.append(node)
            children = node.values() if isinstance(node, dict) else node
            pending.extend((child, d + 1) for child in list(children)[:64])
    return found


def edit_tree(tree: Packed, rng: random.Random) -> Packed:
    """Change the decoded tree in one place; returns the (possibly new) root."""
    containers = _containers(tree)
    if not containers or rng.random() < 0.05:
        return hostile_value(rng)
    node = rng.choice(containers)
    choice = rng.random()
    if isinstance(node, dict):
        keys = list(node)
        if keys and choice < 0.6:
            node[rng.choice(keys)] = hostile_value(rng)
        elif keys and choice < 0.8:
            del node[rng.choice(keys)]
        else:
            node[rng.choice(("extra", "v", "t", "index", b"k", 7))] = hostile_value(rng)
    elif node and choice < 0.6:
        node[rng.randrange(len(node))] = hostile_value(rng)
    elif node and choice < 0.75:
        del node[rng.randrange(len(node))]
    elif node and choice < 0.9:
        node.extend([node[rng.randrange(len(node))]] * rng.randrange(1, 4))
    else:
        node.append(hostile_value(rng))
    return tree


def place_value(tree: Packed, value: Packed, rng: random.Random) -> Packed:
    """`tree` with one of its map values or list items (or the whole tree) replaced by `value`: how a
    structure-aware generator's value is put where a decoder will meet it."""
    containers = [node for node in _containers(tree) if node]
    if not containers or rng.random() < 0.05:
        return value
    node = rng.choice(containers)
    if isinstance(node, dict):
        node[rng.choice(list(node))] = value
    else:
        node[rng.randrange(len(node))] = value
    return tree


def _encode(tree: Packed) -> bytes | None:
    try:
        return msgpack.packb(tree, use_bin_type=True)
    except Exception:  # noqa: BLE001 - e.g. a float key: no such tree can travel, so there is nothing to try
        return None


def _first_value(data: bytes) -> tuple[Packed, int]:
    """The first msgpack value in `data` and the bytes it took (a frame's payload may follow it)."""
    unpacker = msgpack.Unpacker(raw=False, strict_map_key=False, max_buffer_size=max(len(data), 1))
    unpacker.feed(data)
    value = unpacker.unpack()
    return value, unpacker.tell()


def mutate_tree(data: bytes, rng: random.Random, prefix: int = 0,
                edit: Callable[[Packed, random.Random], Packed] | None = None) -> bytes | None:
    """`data` with the msgpack value after its `prefix`-byte big-endian length edited (by `edit`, default once or
    a few times by `edit_tree`) and encoded again, the length set to match and whatever followed kept; None when
    there is no such value."""
    try:
        tree, used = _first_value(data[prefix:])
    except Exception:  # noqa: BLE001 - not msgpack there (a sealed encoding): byte edits only
        return None
    if edit is not None:
        tree = edit(tree, rng)
    else:
        for _ in range(rng.choice((1, 1, 1, 2, 3))):
            tree = edit_tree(tree, rng)
    encoded = _encode(tree)
    if encoded is None or (prefix and len(encoded) >= 1 << (8 * prefix)):
        return None
    length = len(encoded).to_bytes(prefix, "big") if prefix else b""
    return length + encoded + data[prefix + used :]


def mutate(data: bytes, rng: random.Random, *, prefix: int = 0) -> bytes:
    """One hostile variant of the valid encoding `data` (a `prefix`-byte length first, if it is framed)."""
    out = mutate_tree(data, rng, prefix) if rng.random() < 0.5 else None
    if out is None:
        out = data
        for _ in range(rng.choice((1, 1, 1, 2, 4))):
            out = rng.choice(BYTE_EDITS)(out, rng)
    return out[:MAX_INPUT_BYTES]


def splice(first: bytes, second: bytes, rng: random.Random) -> bytes:
    """The start of one valid encoding joined to the end of another."""
    return (first[: rng.randrange(len(first) + 1)] + second[rng.randrange(len(second) + 1) :])[:MAX_INPUT_BYTES]
