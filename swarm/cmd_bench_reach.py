"""`swarm bench reach`: see swarm/bench_reach.py."""

from swarm.bench_reach import add_arguments, run  # noqa: F401
