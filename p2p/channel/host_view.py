"""What the data channel asks of its libp2p host (p2p.host.p2p_host.P2PHost), named here because the channel sits
below the host: it opens the handshake stream, serves the handshake protocol, and reads who is connected."""

from __future__ import annotations

from typing import Protocol

from libp2p.abc import INetStream

from p2p.stream_guard import StreamHandler


class ChannelHost(Protocol):
    """The host calls the data channel makes."""

    @property
    def peer_id(self) -> str: ...

    @property
    def bound_multiaddrs(self) -> list[str]: ...

    def connected_peers(self) -> list[str]: ...

    async def new_stream(self, peer_id: str, protocol: str) -> INetStream: ...

    def remote_peer_id(self, stream: INetStream) -> str: ...

    def set_guarded_handler(self, protocol: str, handler: StreamHandler, timeout: float | None = ..., *,
                            idle_streams: bool = False) -> None: ...

    def remove_handler(self, protocol: str) -> None: ...
