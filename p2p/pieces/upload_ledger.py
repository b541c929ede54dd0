"""What each peer has taken from us and given back, for one manifest: uploads are earned, not free.

Why: every peer of a run is meant to be cooperative, so the engine unchokes everyone (no tit-for-tat, see
p2p/pieces/engine.py); a leech could then re-request the same few pieces forever and pull gigabytes a minute from a
seed. Two bounds keep what a peer can take proportional to what it could possibly need:

- per link: a peer never needs a piece twice, so asking again for a piece it already received on that link is a
  protocol breach (BitTorrent treats a request for a piece the requester has as one too). One re-request per piece
  is forgiven after the peer cancelled it (an honest peer cancels a request that timed out, then may ask again
  while our copy was already on its way);
- per peer, over every link of this version: at most `upload_factor` times the version's piece count, plus
  `earn_per_piece` for each verified piece it served us. An honest downloader needs each piece once, so a few
  times the version is generous; a peer that reciprocates earns more.

No IO and no clock: the engine asks and records, the adapter never sees this.
"""

from __future__ import annotations

from collections import OrderedDict

MAX_PEERS_REMEMBERED = 4096
"""Peers whose totals are kept: identities are free, so the ledger forgets the least recently active past this
(a forgotten leech starts from zero, as a fresh identity would anyway)."""


class UploadLedger:
    """Pieces sent to and received from each peer for one manifest, across that peer's links."""

    def __init__(self, num_pieces: int, upload_factor: float, earn_per_piece: float) -> None:
        self.num_pieces = num_pieces
        self.upload_factor = upload_factor
        self.earn_per_piece = earn_per_piece
        self._sent: OrderedDict[str, int] = OrderedDict()
        self._received: OrderedDict[str, int] = OrderedDict()

    def sent(self, peer: str) -> int:
        """Pieces delivered to `peer` for this manifest."""
        return self._sent.get(peer, 0)

    def received(self, peer: str) -> int:
        """Verified pieces `peer` served us for this manifest."""
        return self._received.get(peer, 0)

    def allowance(self, peer: str) -> float:
        """Pieces `peer` may take from us in all: a few copies of the version, more for what it gave back."""
        return self.upload_factor * self.num_pieces + self.earn_per_piece * self.received(peer)

    def exhausted(self, peer: str) -> bool:
        """Whether `peer` has taken all it may: its next request is a leech's, and drops it."""
        return self.sent(peer) >= self.allowance(peer)

    def note_sent(self, peer: str) -> None:
        _bump(self._sent, peer)

    def note_received(self, peer: str) -> None:
        _bump(self._received, peer)


def _bump(counts: OrderedDict[str, int], peer: str) -> None:
    counts[peer] = counts.pop(peer, 0) + 1  # most recently active last
    while len(counts) > MAX_PEERS_REMEMBERED:
        counts.popitem(last=False)
