"""`swarm bench broadcast`: see swarm/bench_broadcast.py."""

from swarm.bench_broadcast import add_arguments, run  # noqa: F401
