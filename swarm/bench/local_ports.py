"""Loopback ports chosen before the processes that listen on them start."""

from __future__ import annotations

import socket
from contextlib import ExitStack


def free_ports(count: int) -> list[int]:
    """`count` distinct loopback TCP ports nothing listens on now. Why: a benchmark that knows every process's address
    before any starts can start them all at once (and restart one on its address). Every probe stays bound until
    all are chosen: a probe's port, once closed, may be handed out again at once, and two processes given one port
    fail to listen. The ports are free when probed, so the only loss is a rare collision with another program, which
    the process reports as a failed listen."""
    with ExitStack() as stack:
        probes = [stack.enter_context(socket.socket()) for _ in range(count)]
        for probe in probes:
            probe.bind(("127.0.0.1", 0))
        return [probe.getsockname()[1] for probe in probes]


def free_port() -> int:
    """One loopback TCP port nothing listens on now (see `free_ports`)."""
    return free_ports(1)[0]
