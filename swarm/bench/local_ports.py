"""Loopback ports chosen before the processes that listen on them start."""

from __future__ import annotations

import socket


def free_port() -> int:
    """A loopback TCP port nothing listens on now. Why: a benchmark that knows every process's address before any
    starts can start them all at once (and restart one on its address); the port is free when probed, so the only
    loss is a rare collision with another program, which the process reports as a failed listen."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]
