"""Policy pieces: signed manifests, the wire messages, the sans-IO swarm engine and its picker, the piece store and
the transfer service that drives them over links. Knows nothing of hosts, gossip or the DHT: links are handed in."""
