"""Errors raised by the p2p package.

Every class here is user-facing: the CLI prints its one-sentence message on one line, without a traceback.
Other p2p modules (host, gossip, DHT) add their own subclasses here or beside their code, always deriving from
P2PError so a caller can catch the whole family at once.
"""

from __future__ import annotations


class P2PError(Exception):
    """Base class of every p2p failure a user can act on."""

    user_facing = True


class FrameError(P2PError):
    """A piece-protocol frame was malformed, oversized or truncated: the peer that sent it is dropped."""


class FrameTruncatedError(FrameError):
    """The stream ended inside a frame: the peer vanished mid-piece (no breach of the protocol by itself)."""


class ManifestError(P2PError):
    """A policy manifest is malformed, oversized, tampered with or not signed by the run's trainer key."""


class PatchError(P2PError):
    """A policy patch is malformed, inflates past its tensors, or does not rebuild the tensors its manifest names."""


class StoreError(P2PError):
    """The piece store cannot be used (locked by another process, disk full, corrupt content)."""


class StoreLockedError(StoreError):
    """Another process already holds the piece store's data directory."""


class DiskFullError(StoreError):
    """The disk holding the piece store ran out of space (ENOSPC)."""


class PieceVerifyError(P2PError):
    """A piece's bytes do not hash to the BLAKE3 named in the signed manifest."""


class CorruptPieceError(StoreError):
    """A piece held on disk no longer hashes right (the file changed after it was stored): it is not served."""


class IdentityError(P2PError):
    """A key file is missing, unreadable, corrupt or would be overwritten."""


class BootstrapError(P2PError):
    """A bootstrap list (flag, config or bootstrap_peers.txt) holds a line that is not a valid multiaddr."""


class HostError(P2PError):
    """The libp2p host cannot start, dial or open a stream (bad address, unreachable peer, timeout)."""


class StreamEndedEarly(HostError):
    """The peer closed a stream before sending what the protocol promised."""


class ChannelError(P2PError):
    """A data channel failed: handshake refused, record tampered, truncated or the peer vanished mid-transfer."""


class ChannelTamperedError(ChannelError):
    """A data channel record failed authentication or broke the record format: forged or tampered bytes, never
    what a peer that merely vanished leaves behind."""


class EnvelopeError(P2PError):
    """A gossip envelope was refused (malformed, oversized, badly signed, wrong run, stale or replayed).

    `reason` is one of the short codes in `p2p.gossip.envelope.REASONS`; peer scoring weighs rejections by it.
    """

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


class GossipError(P2PError):
    """A message cannot be published on gossip (too large, unknown kind, gossip not running)."""


class DHTError(P2PError):
    """A DHT operation failed: a record not signed by the run's trainer key, or a lookup that timed out."""
