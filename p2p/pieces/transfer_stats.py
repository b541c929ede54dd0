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


@dataclass(frozen=True)
class LinkActivity:
    """What one open link has carried lately, for deciding whether it still earns its place (a link costs a data
    channel, and its place could go to a peer that moves pieces)."""

    opened_at: float  # when the link was added
    active_at: float  # last verified piece received, piece sent, or request for a piece we hold (else opened_at)
    greeted: bool  # the peer's hello came: until then nothing is known of what it holds
    offers: bool  # it claims a piece we lack
    lacks: bool  # it lacks a piece we hold (as far as it told us and we sent it)
