"""The data channel: a libp2p-authenticated offer, then AEAD records on a plain TCP socket (or a libp2p stream)."""
