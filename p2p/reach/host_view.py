"""What the reachability service asks of its libp2p host (p2p.host.p2p_host.P2PHost), named here because reach sits
below the host: its libp2p host, its bootstrap peers and settings, its listen addresses, redials and guarded
handlers."""

from __future__ import annotations

from typing import Protocol

from libp2p.abc import IHost, INetStream

from p2p.reach.probe import ReachConfig
from p2p.stream_guard import StreamHandler


class ReachHostConfig(Protocol):
    """The host settings reach reads (p2p.host.p2p_host.HostConfig)."""

    @property
    def bootstrap(self) -> tuple[str, ...]: ...

    @property
    def reach(self) -> ReachConfig: ...


class ReachHost(Protocol):
    """The host calls the reachability service makes."""

    @property
    def libp2p(self) -> IHost: ...

    @property
    def config(self) -> ReachHostConfig: ...

    @property
    def bound_multiaddrs(self) -> list[str]: ...

    async def new_stream(self, peer_id: str, protocol: str) -> INetStream: ...

    async def redial(self, multiaddr: str) -> str: ...

    def set_guarded_handler(self, protocol: str, handler: StreamHandler, timeout: float | None = ..., *,
                            idle_streams: bool = False) -> None: ...
