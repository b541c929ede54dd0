"""`swarm sim`: the whole swarm on one machine."""
