"""Routing inbound piece-protocol links: one node serves several manifests, and a link names its own in its hello."""

from __future__ import annotations

import trio

from p2p.pieces.transfer import _LINK_ERRORS, SwarmService, _Opened
from p2p.pieces.wire import FrameDecoder, Stream, read_frame


class SwarmRouter:
    """Hands each inbound link to the SwarmService of the manifest its hello names.

    One node serves several policy versions at once (the async window); a dialer opens one link per (peer,
    manifest) and speaks first, so the accepting side reads the hello, then routes. Unknown manifests, silence
    and garbage close the link without touching any service.
    """

    def __init__(self, handshake_timeout: float = 10.0, max_payload: int = 4 << 20) -> None:
        self.handshake_timeout = handshake_timeout
        self.max_payload = max_payload
        self.services: dict[bytes, SwarmService] = {}

    def register(self, service: SwarmService) -> None:
        self.services[service.manifest.id] = service

    def unregister(self, manifest_id: bytes) -> None:
        self.services.pop(manifest_id, None)

    async def accept(self, peer: str, stream: Stream) -> bool:
        """Route one inbound link; False (and the link closed) when no running service wants it."""
        decoder = FrameDecoder(max_payload=self.max_payload)
        try:
            with trio.fail_after(self.handshake_timeout):
                frame = await read_frame(stream, decoder)
        except _LINK_ERRORS:
            frame = None
        service = None
        if frame is not None and frame[0].get("t") == "hello" and isinstance(frame[0].get("manifest_id"), bytes):
            service = self.services.get(frame[0]["manifest_id"])
        if service is None or not service.add_link(peer, stream, _Opened(decoder, frame)):
            await trio.aclose_forcefully(stream)
            return False
        return True
