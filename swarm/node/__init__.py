"""One peer's runtime: its libp2p host, the run's gossip, data channels, and the lifecycle of its roles."""
