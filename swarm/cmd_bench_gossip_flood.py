"""`swarm bench gossip-flood`: see swarm/bench_gossip_flood.py."""

from swarm.bench_gossip_flood import add_arguments, run  # noqa: F401
