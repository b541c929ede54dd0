"""The Kademlia lookup, pure: the network is the injected `ask(peer)` callable, so its bounds (queries,
concurrency, its end) are tested on an in-memory network of thousands of peers (p2p.dht.service drives it over
libp2p)."""

from __future__ import annotations

import hashlib
import logging
import math
from collections.abc import Awaitable, Callable, Hashable, Iterable, Sequence
from typing import TYPE_CHECKING, TypeVar

import trio

if TYPE_CHECKING:  # libp2p is heavy to import (tests/test_import_contract.py); the lookup itself never needs it
    from libp2p.peer.id import ID

log = logging.getLogger("p2p.dht")
P = TypeVar("P", bound=Hashable)
T = TypeVar("T")


async def traverse(
    start: Sequence[P],
    ask: Callable[[P], Awaitable[tuple[list[T], list[P]]]],
    *,
    enough: Callable[[list[T]], bool],
    max_queries: int,
    concurrency: int,
    rank: Callable[[P], int] | None = None,
    skip: frozenset | set = frozenset(),
    timeout: float = math.inf,
    closest: int = 0,
) -> list[T]:
    """Iterative Kademlia-style lookup: ask the best-ranked unasked peers (`concurrency` at a time) for items and
    closer peers, until `enough(items)`, no candidates remain, `max_queries` peers were asked or `timeout` seconds
    passed; returns the items found so far. A peer whose `ask` raises is skipped (unreachable or hostile peers
    cost one query, nothing more).

    `closest` (for lookups whose items are the peers that answered, ranked by `rank`): stop also once that many
    answered and every candidate left ranks after all of them, Kademlia's own end: nobody closer is left to ask;
    never before `closest + concurrency` peers were asked, so a few identities ground close to the key that answer
    with nothing cannot end a lookup before it reached past them.
    Why: without it a lookup for the closest peers asks its whole budget every time (40 queries for each provide,
    put and refresh), though among 64 peers the 20 closest have answered after about half of them."""
    items: list[T] = []
    asked: set[P] = set(skip)
    candidates: list[P] = _ranked(dict.fromkeys(p for p in start if p not in asked), rank)
    budget = max_queries

    async def ask_one(peer: P) -> None:
        try:
            found, closer = await ask(peer)
        except Exception:  # noqa: BLE001 - see docstring
            log.debug("lookup query to %s failed", peer, exc_info=True)
            return
        items.extend(found)
        candidates.extend(p for p in closer if p not in asked and p not in candidates)

    with trio.move_on_after(timeout):
        while candidates and budget > 0 and not enough(items):
            batch, candidates[:] = candidates[: min(concurrency, budget)], candidates[min(concurrency, budget):]
            asked.update(batch)
            budget -= len(batch)
            async with trio.open_nursery() as nursery:
                for peer in batch:
                    nursery.start_soon(ask_one, peer)
            candidates[:] = _ranked(candidates, rank)
            if (closest and rank is not None and max_queries - budget >= closest + concurrency
                    and _converged(items, candidates, rank, closest)):
                break
    return list(items)


def _converged(answered: Sequence[P], candidates: Sequence[P], rank: Callable[[P], int], closest: int) -> bool:
    """Whether the `closest` best-ranked peers that answered all rank ahead of the best candidate left."""
    if len(answered) < closest:
        return False
    kth = sorted(map(rank, answered))[closest - 1]
    return not candidates or rank(candidates[0]) > kth


def _ranked(peers: Iterable[P], rank: Callable[[P], int] | None) -> list[P]:
    return sorted(peers, key=rank) if rank is not None else list(peers)


def xor_rank(key: bytes) -> Callable[[ID], int]:
    """Kademlia distance from `key` to a libp2p peer id, in py-libp2p's keyspace (SHA-256 of both)."""
    target = int.from_bytes(hashlib.sha256(key).digest(), "big")
    return lambda peer: target ^ int.from_bytes(hashlib.sha256(peer.to_bytes()).digest(), "big")
