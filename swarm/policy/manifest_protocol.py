"""A tiny request-response protocol that hands out signed manifests by id.

Why: gossip carries only new announcements, so a peer that joins late (or a manifest too large for one gossip
message) learns a manifest id from a heartbeat and fetches the signed bytes from the peer that named it. The bytes
are verified against the trainer key by the mirror like any other manifest; this protocol trusts nothing.
Request: the 32-byte manifest id. Response: 4-byte big-endian length, then the signed manifest (length 0: unknown).

Faults stay on their side: the server runs under the host's guard (an unexpected error resets that one stream and
costs the asking peer score, see p2p.host.p2p_host), and the asker turns anything the peer or py-libp2p raises into one
HostError, the only error its callers (heartbeats, announcements, the DHT lookup, `swarm status`) expect.
"""

from __future__ import annotations

import struct
from collections.abc import Awaitable, Callable

import trio

from p2p.errors import HostError
from p2p.host.p2p_host import peer_went_away, read_exactly
from p2p.pieces.manifest import MAX_MANIFEST_BYTES
from swarm.node.ports import HostPort, HostStream

PROTOCOL = "/rl-swarm/manifest/1.0.0"
_LEN = struct.Struct(">I")
_MAX_RESPONSE = MAX_MANIFEST_BYTES + 4096


def install_manifest_server(host: HostPort, lookup: Callable[[bytes], bytes | None]) -> None:
    """Answer manifest requests from `lookup(id) -> signed bytes or None`."""

    async def handle(stream: HostStream) -> None:
        manifest_id = await read_exactly(stream, 32, "manifest stream")
        signed = lookup(manifest_id) or b""
        await stream.write(_LEN.pack(len(signed)) + signed)
        await stream.close()

    host.set_guarded_handler(PROTOCOL, handle, timeout=30.0)


ManifestFetch = Callable[[HostPort, str, bytes], Awaitable[bytes | None]]
"""How a node fetches a signed manifest by id from a peer (`fetch_manifest`, or a test's stand-in)."""


async def fetch_manifest(host: HostPort, peer_id: str, manifest_id: bytes, timeout: float = 15.0) -> bytes | None:
    """The signed manifest `manifest_id` from `peer_id`, or None if it does not have it; HostError on failure."""
    stream = await host.new_stream(peer_id, PROTOCOL)
    try:
        with trio.fail_after(timeout):
            await stream.write(manifest_id)
            (length,) = _LEN.unpack(await read_exactly(stream, _LEN.size, "manifest stream"))
            if length > _MAX_RESPONSE:
                raise HostError(f"peer {peer_id} offered a {length}-byte manifest, over the limit")
            return await read_exactly(stream, length, "manifest stream") if length else None
    except trio.TooSlowError:
        raise HostError(f"fetching manifest from {peer_id} timed out") from None
    except HostError:
        raise
    except Exception as exc:  # noqa: BLE001 - py-libp2p's own errors on a reset stream, or anything unforeseen
        what = "closed the manifest stream" if peer_went_away(exc) else "broke the manifest exchange"
        raise HostError(f"peer {peer_id} {what} ({type(exc).__name__})") from exc
    finally:
        with trio.move_on_after(1.0):
            try:
                await stream.close()
            except Exception:  # noqa: BLE001 - the stream may already be reset
                pass
