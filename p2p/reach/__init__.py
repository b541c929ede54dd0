"""Reachability: dial-back probes, relay reservations and circuits, and DCUtR hole punching. Below the host, which
opens it; it knows nothing of gossip, the DHT or pieces."""
