"""Fuzz targets for policy patches (p2p.pieces.patch): the head and every block, decoded without a parent.

A patch reaches a peer as pieces checked against its signed manifest, so only a run's own trainer key can make one
arrive; it is fuzzed all the same, since that decoder inflates blocks and indexes arrays. Samples are built in
memory: a safetensors prefix for two bf16 tensors, a parent and a child with a few changed elements, encoded the
ways a trainer encodes them (gaps, bitmask, whole, unchanged)."""

from __future__ import annotations

import functools
import json

import numpy as np

from p2p.errors import PatchError
from p2p.pieces.patch import check_blocks, encode_tensor
from p2p.pieces.patch_format import encode_head

ERRORS = (PatchError,)


def _prefix(sizes: dict[str, int]) -> bytes:
    header, offset = {}, 0
    for name, count in sizes.items():
        header[name] = {"dtype": "BF16", "shape": [count], "data_offsets": [offset, offset + 2 * count]}
        offset += 2 * count
    body = json.dumps(header).encode()
    body += b" " * (-len(body) % 8)
    return len(body).to_bytes(8, "little") + body


@functools.cache
def patch_samples() -> list[bytes]:
    rng = np.random.default_rng(0)
    sizes = {"a": 4096, "b": 1024, "c": 64}
    old = {name: rng.integers(0, 1 << 16, n, dtype=np.uint16) for name, n in sizes.items()}
    new = {name: values.copy() for name, values in old.items()}
    new["a"][rng.random(4096) < 0.01] += 1  # sparse: gaps
    new["b"][rng.random(1024) < 0.3] += 1  # dense: a bitmask
    entries, blocks = [], []
    for name in sizes:
        encoding, changed, positions, values = encode_tensor(old[name].tobytes(), new[name].tobytes(), 2, 3)
        entries.append([name, encoding, changed, len(positions), len(values)])
        blocks += [positions, values]
    whole = encode_tensor(None, new["c"].tobytes(), 2, 3)
    entries[2] = ["c", whole[0], whole[1], len(whole[2]), len(whole[3])]
    blocks[4:6] = [whole[2], whole[3]]
    head = encode_head([{"name": "model.safetensors", "header": _prefix(sizes), "tensors": entries}])
    return [head + b"".join(blocks)]


def decode_patch(data: bytes) -> int:
    return check_blocks(data)
