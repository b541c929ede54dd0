"""py-libp2p's DCUtR (hole punching) held to p2p.reach.punch_guard: it dials only the addresses the guard admits,
at the guard's node-wide rate, and keeps nothing a stranger claims.

Where py-libp2p's session dials: its unilateral upgrade (every peerstore address of the peer), then three rounds
over the CONNECT message's addresses plus the peerstore's again, each through `_dial_peer`; the CONNECT addresses
also enter the peerstore for ten minutes. Every dial passes `_dial_peer`, so the guard sits there, and the admitted
addresses are chosen where the session starts to punch (`_perform_hole_punch`).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Any

import trio
from libp2p.abc import IHost, INetConn, INetwork, IPeerStore
from libp2p.peer.id import ID
from libp2p.relay.circuit_v2.dcutr import DCUtRProtocol
from libp2p.tools.anyio_service import background_trio_service
from multiaddr import Multiaddr

from p2p.reach.probe import MAX_PUNCH_ADDRS
from p2p.reach.punch_guard import PunchGuard


class _FewAddrs:
    """A peerstore that shows at most MAX_PUNCH_ADDRS addresses of each peer and takes none from DCUtR. Why: identify
    keeps up to 1,000 addresses a peer claims, and a CONNECT message's addresses would otherwise be kept (and dialed
    by whatever dials that peer later) on a stranger's word."""

    def __init__(self, peerstore: IPeerStore) -> None:
        self._peerstore = peerstore

    def addrs(self, peer_id: ID) -> list[Multiaddr]:
        return list(self._peerstore.addrs(peer_id))[:MAX_PUNCH_ADDRS]

    def add_addrs(self, peer_id: ID, addrs: Sequence[Multiaddr], ttl: int) -> None:
        """Nothing: what DCUtR learns is a claim of the peer's, kept only for the session's own dials."""

    def __getattr__(self, name: str) -> Any:
        return getattr(self._peerstore, name)


class _OneAttempt:
    """The swarm as DCUtR sees it: `dial_addr` makes one attempt. Why: the swarm's own dial retries three times
    more, with backoff, so each hole-punch dial of an address a stranger named became four connections to it; a
    punch's rounds are its retries."""

    def __init__(self, network: INetwork) -> None:
        self._network = network

    async def dial_addr(self, addr: Multiaddr, peer_id: ID, source: tuple[str, int] | None = None) -> INetConn:
        return await self._network._dial_addr_single_attempt(addr, peer_id, source)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._network, name)


class _PunchHost:
    """The libp2p host as DCUtR sees it: the same, but for its peerstore (`_FewAddrs`) and swarm (`_OneAttempt`)."""

    def __init__(self, host: IHost) -> None:
        self._host = host

    def get_peerstore(self) -> _FewAddrs:
        return _FewAddrs(self._host.get_peerstore())

    def get_network(self) -> _OneAttempt:
        return _OneAttempt(self._host.get_network())

    def __getattr__(self, name: str) -> Any:
        return getattr(self._host, name)


class GuardedDCUtR(DCUtRProtocol):
    """py-libp2p's DCUtR without its own drive loop, which starts a session toward every relayed peer from both
    ends (and toward one peer after another): p2p.reach.service starts them instead, see
    p2p.reach.probe.punch_targets. It dials only what `guard` admits, when `guard` allows."""

    def __init__(self, host: IHost, guard: PunchGuard) -> None:
        super().__init__(_PunchHost(host))
        self.guard = guard
        host._dcutr_protocol = self  # the host tells it of disconnections (it resets its caches then)

    async def _auto_drive_loop(self) -> None:
        await trio.sleep_forever()

    def _decode_observed_addrs(self, addr_bytes: list[bytes]) -> list[Multiaddr]:
        """The first MAX_PUNCH_ADDRS addresses a peer's DCUtR message names (the guard admits fewer still)."""
        return super()._decode_observed_addrs(addr_bytes[:MAX_PUNCH_ADDRS])[:MAX_PUNCH_ADDRS]

    async def _perform_hole_punch(self, peer_id: ID, addrs: list[Multiaddr], as_responder: bool = False) -> bool:
        admitted = self.guard.admit(str(peer_id), [str(a) for a in addrs], trio.current_time())
        return await super()._perform_hole_punch(peer_id, [Multiaddr(a) for a in admitted], as_responder)

    async def _dial_peer(self, peer_id: ID, addr: Multiaddr, source: tuple[str, int] | None = None,
                         as_responder: bool = False) -> None:
        if self.guard.may_dial(str(peer_id), str(addr), trio.current_time()):
            await super()._dial_peer(peer_id, addr, source, as_responder)


@asynccontextmanager
async def hole_punching(libp2p_host: IHost, guard: PunchGuard, enabled: bool) -> AsyncIterator[GuardedDCUtR | None]:
    """A running GuardedDCUtR on `libp2p_host` (None when hole punching is off)."""
    if not enabled:
        yield None
        return
    dcutr = GuardedDCUtR(libp2p_host, guard)
    async with background_trio_service(dcutr):
        await dcutr.event_started.wait()
        yield dcutr
