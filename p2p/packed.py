"""The type of a plain msgpack value: what this project's decoders get from `msgpack.unpackb` and what its encoders
hand to `msgpack.packb` (envelope bodies, manifests, handshake messages, the fuzz bench's trees).

A type only: maps may have keys of any of these types (int, str and bytes in practice), arrays arrive as lists and
may leave as tuples. Every decoder still checks each value it reads with isinstance, since the bytes are a peer's.
"""

from __future__ import annotations

from typing import TypeAlias

Packed: TypeAlias = "None | bool | int | float | str | bytes | list[Packed] | tuple[Packed, ...] | dict[Packed, Packed]"
"""One decoded (or to be encoded) msgpack value, containers nested to any depth."""
