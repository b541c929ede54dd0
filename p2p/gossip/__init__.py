"""Signed gossip: envelopes, replay filtering, admission and scoring of each message, over py-libp2p's GossipSub."""
