"""The body of a manifest announcement a node gossips for a new version (swarm.messages.gossip_bodies)."""

from __future__ import annotations

from p2p.pieces.manifest import PolicyManifest

GOSSIP_INLINE_MANIFEST = 512 * 1024
"""Largest signed manifest carried inside its announcement; larger ones are fetched by id."""


def announcement_body(signed: bytes, manifest: PolicyManifest) -> dict:
    """The manifest announcement's body: inline when small, by id otherwise (swarm.messages.gossip_bodies)."""
    body = {"id": manifest.id, "version": manifest.version}
    if len(signed) <= GOSSIP_INLINE_MANIFEST:
        body["signed"] = signed
    return body
