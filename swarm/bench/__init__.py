"""Every `swarm bench` command and what only benchmarks use (attack generators, simulations, bounds, fuzz targets)."""
