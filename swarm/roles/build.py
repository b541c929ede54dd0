"""The roles a peer can play, as tasks that run beside the node's networking.

Every role mirrors the run's policies (that is the node itself); `seed` adds nothing else: seed-only mode is the
node alone, and never imports torch. The trainer, inference and validator roles import their packages lazily.
"""

from __future__ import annotations

import resource

from swarm.config import PeerConfig
from swarm.event_types import Finished
from swarm.node.state import Node, RoleTask


def build_roles(config: PeerConfig) -> list[RoleTask]:
    """The role tasks of `config`, after the checks that need the machine or the files it names (a GPU that is not
    there, a model that does not exist, a trainer config that does not load fail here, in one line, before the peer
    joins a swarm it could not serve)."""
    if set(config.peer.roles) & {"trainer", "inference", "validator"}:
        from inference.models import check_model_spec

        check_model_spec(config.peer.model)
    if "trainer" in config.peer.roles:
        from swarm.roles.trainer import load_role_config

        load_role_config(config.peer, config.trainer)
    if "validator" in config.peer.roles or "trainer" in config.peer.roles:
        from inference.select import resolve_device

        resolve_device(config.peer.device)
    if "inference" in config.peer.roles:
        from inference.select import require_backend

        require_backend(config.inference.backend)
    tasks: list[RoleTask] = []
    if config.mirror.exit_when_complete:
        tasks.append(exit_when_newest_complete)
    for role in config.peer.roles:
        if role == "seed":
            continue
        from swarm.roles import registry

        tasks.append(registry.ROLE_TASKS[role])
    return tasks


async def exit_when_newest_complete(node: Node) -> None:
    """Stop the peer once the newest policy it knows is complete (benchmarks and scripted runs)."""

    while True:
        newest = node.mirror.latest()
        if newest is not None and newest.service is not None and newest.ready.is_set():
            rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
            prog = newest.service.progress()
            node.events.emit(Finished(version=newest.manifest.version, max_rss_mb=round(rss_mb, 1),
                                      down_from=prog.bytes_down, up_to=prog.bytes_up))
            node.done.set()
            return
        await node.mirror.changed.wait()
