"""The `swarm` command line: one module per command, imported only when that command runs."""

from swarm.cli.main import main

__all__ = ["main"]
