"""What a piece-protocol service reports of itself: bytes and pieces per peer, and progress snapshots."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class PeerStats:
    """Bytes and pieces moved with one peer (kept after it leaves)."""

    bytes_up: int = 0
    bytes_down: int = 0
    pieces_up: int = 0
    pieces_down: int = 0
    pieces_corrupt: int = 0  # received pieces whose BLAKE3 did not match the manifest (counted in pieces_down too)


@dataclass(frozen=True)
class Progress:
    """A snapshot for progress displays: pieces held and bytes moved per peer."""

    pieces_done: int
    pieces_total: int
    bytes_up: dict[str, int]
    bytes_down: dict[str, int]
    drops: dict[str, str]  # peer -> why it was dropped
