"""Who holds a version's link places: pure decisions over what each link carried, with `now` passed in.

A place costs a data channel and a share of the peer's attention, and identities are free, so a place is held only
while its link moves pieces:

- a link is idle when it could carry pieces (one side claims a piece the other lacks) and has carried none, in
  either direction, nor a request for a piece we hold, for `idle_after` seconds; an idle link is released and its
  peer is not admitted again for that version unless this peer chooses it. Unproductive *for whom* matters: an
  honest newcomer holds nothing either, but it asks for what we hold at once, so its link is busy; a squatter that
  claims nothing and asks nothing is idle. Two peers that both hold everything have nothing to move: their link is
  not idle (closing it would only have it reopened), but it is the first to go when a place is needed;
- an untrusted peer that lacks pieces we hold, claims none we lack and has asked for nothing within
  `first_ask_within` of its link opening is idle sooner: an honest newcomer asks within a round trip;
- links others opened to us hold at most `stranger_places` per version (a node-wide bound per version, whatever the
  number of identities); a newcomer past it takes the place of a link quiet for `idle_after`, a trusted one (one
  that served us before, or the version's origin, or a provider) the place of any link of an untrusted peer that has
  never carried anything, else it is refused (the dialer links elsewhere);
- this peer's own choices go first to trusted peers, keeping one place for a stranger drawn in the version's
  secret order (BitTorrent's optimistic unchoke): an idle link is replaced by the next candidate in that order, so
  the optimistic place rotates through the neighbours until one moves pieces.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from p2p.pieces.transfer_stats import LinkActivity

FIRST_ASK_WITHIN = 2.0
"""Seconds a peer that lacks pieces we hold may go without asking for any, from its hello, before its link is idle:
an honest peer asks for what it lacks within a round trip of hearing of it, a squatter never does."""
LINK_IDLE_AFTER = 5.0
"""Seconds a link that could carry pieces may carry none (nor a request for a piece we hold) before its place is
released. Why 5 s: an honest peer asks for a piece it lacks within a round trip and a busy uploader refuses (BUSY)
rather than queues for long, so 5 s of silence on a link with something to move is a peer holding a place for
nothing, and a longer wait lets a crowd of identities, each taking a place per version, hold them through a whole
small version."""


@dataclass(frozen=True)
class Admission:
    """Whether a link another peer opened takes a place: `admit`, after closing `evict` when set."""

    admit: bool
    evict: str | None = None


REFUSED = Admission(False)


def idle(activity: LinkActivity, now: float, idle_after: float = LINK_IDLE_AFTER, trusted: bool = False,
         first_ask_within: float = FIRST_ASK_WITHIN) -> bool:
    """Whether a link has had something to carry and carried nothing for `idle_after` seconds, or, for an untrusted
    peer, has never carried anything though its peer lacks what we hold and claims nothing we lack, for
    `first_ask_within` (a peer that moved pieces with us before may be fetching what we hold elsewhere)."""
    if not activity.greeted:
        return False  # its handshake, bounded by handshake_timeout: nothing known of what it holds yet
    never_asked = (not trusted and activity.active_at == activity.opened_at and activity.lacks
                   and not activity.offers)
    if never_asked and now - activity.opened_at >= min(first_ask_within, idle_after):
        return True
    if now - activity.opened_at < idle_after:
        return False
    return (activity.offers or activity.lacks) and now - activity.active_at >= idle_after


def quiet(activity: LinkActivity, now: float, idle_after: float = LINK_IDLE_AFTER) -> bool:
    """Whether a link carried nothing for `idle_after`, whether or not it had anything to carry: idle, or between
    two peers that both hold everything. Such a link gives its place up first when a newcomer needs one."""
    return now - activity.active_at >= idle_after and now - activity.opened_at >= idle_after


def admit(newcomer: str, theirs: Mapping[str, LinkActivity], *, places: int, now: float,
          trusted: Callable[[str], bool], idle_after: float = LINK_IDLE_AFTER) -> Admission:
    """Whether a link `newcomer` opened takes a place among `theirs` (links others opened for this version, with
    what each carried): under `places`, yes; past it, in the place of a quiet link (the quietest first), and for a
    trusted newcomer in the place of any untrusted link that carried nothing in its first seconds too."""
    if len(theirs) < places:
        return Admission(True)
    untrusted = {peer: a for peer, a in theirs.items() if not trusted(peer)}
    candidates = {peer: a for peer, a in untrusted.items() if quiet(a, now, idle_after)}
    if not candidates and trusted(newcomer):
        candidates = {peer: a for peer, a in untrusted.items() if a.active_at == a.opened_at}
    if not candidates:
        return REFUSED
    return Admission(True, min(candidates, key=lambda peer: (candidates[peer].active_at, peer)))


def choose_order(drawn: list[str], trusted: Callable[[str], bool], own_places: int,
                 last: set[str] | frozenset[str] = frozenset(),
                 released: set[str] | frozenset[str] = frozenset(),
                 rank: Callable[[str], tuple[object, ...]] = lambda peer: ()) -> list[str]:
    """The order this peer opens its own links in: trusted peers first, highest `rank` first (ties in `drawn`
    order), for all its own places but one (all of a single place), the next going to the first stranger of `drawn`
    (the version's secret order); then the rest of `drawn`. Peers in `last` (links of this version dropped) come
    after all others; untrusted peers in `released` (links of this version that idled) not at all, so each
    neighbour takes the optimistic place at most once per version and a crowd of connected identities is tried
    through once, not round and round. Why a rank: trust is cheap to buy (a piece taken), so peers that did the
    most for us come first."""
    fresh = [peer for peer in drawn if peer not in last and peer not in released]
    first = sorted((peer for peer in fresh if trusted(peer)), key=rank, reverse=True)[:max(1, own_places - 1)]
    optimistic = [peer for peer in fresh if not trusted(peer)][:1]
    chosen = set(first + optimistic)
    rest = [peer for peer in fresh if peer not in chosen]
    again = [peer for peer in drawn if (peer in last or peer in released) and (peer not in released or trusted(peer))]
    return first + optimistic + rest + again
