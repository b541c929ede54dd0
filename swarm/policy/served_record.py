"""Peers that moved verified pieces with us before: the ones a peer trusts with its link places.

Identities are free, so trust is earned only by what costs a real peer's upload: a peer that served us a verified
piece (of any version) is trusted, and so is one that took at least `took_for_trust` pieces from us (the version's
origin serves first and is served by nobody: the followers that download from it are the peers it knows). A link
released as idle forgets its peer: trust bought with a piece is lost the first time it is used to hold a place for
nothing. At most MAX_REMEMBERED peers are kept, the least recently active forgotten first, so the record's memory
holds for any number of identities.
"""

from __future__ import annotations

from collections import OrderedDict

MAX_REMEMBERED = 256
TOOK_FOR_TRUST = 1
"""Pieces a peer must take from us (with none served back) to be trusted: one, since the origin's followers may each
take only a share of a small version from it. A crowd can buy trust with a piece per identity; it loses it when its
link idles, and buys it again only with another piece of a later version."""


class ServedRecord:
    """Per peer, the most pieces it served us and took from us on one version's link, most recent last."""

    def __init__(self, took_for_trust: int = TOOK_FOR_TRUST, max_remembered: int = MAX_REMEMBERED) -> None:
        self.took_for_trust = took_for_trust
        self.max_remembered = max_remembered
        self._peers: OrderedDict[str, tuple[int, int]] = OrderedDict()

    def note(self, peer: str, served: int, took: int) -> None:
        """What `peer` moved with us on one version so far (verified pieces served to us, pieces taken)."""
        if served <= 0 and took <= 0:
            return
        had_served, had_took = self._peers.pop(peer, (0, 0))
        self._peers[peer] = (max(had_served, served), max(had_took, took))
        while len(self._peers) > self.max_remembered:
            self._peers.popitem(last=False)

    def trusted(self, peer: str) -> bool:
        served, took = self._peers.get(peer, (0, 0))
        return served > 0 or took >= self.took_for_trust

    def score(self, peer: str) -> tuple[int, int]:
        """How much `peer` did for us, for ranking trusted peers: pieces served first (they cost its upload), then
        pieces taken (a crowd can take one each cheaply, not as many as the followers that fetch from us)."""
        return self._peers.get(peer, (0, 0))

    def forget(self, peer: str) -> None:
        self._peers.pop(peer, None)

    def __len__(self) -> int:
        return len(self._peers)
