"""Real gossip nodes on loopback for the hostile-gossip tests: a target meshed on heartbeats with each other node."""

from __future__ import annotations

from contextlib import AsyncExitStack

from p2p.gossip.service import Gossip, open_gossip
from p2p.host.p2p_host import HostConfig, open_host
from p2p.identity import Identity


async def meshed_nodes(stack: AsyncExitStack, run: str, first_seed: int, count: int) -> list[Gossip]:
    """`count` gossip nodes with identities from seeds `first_seed`, `first_seed + 1`, ...; the first (the target)
    is connected to every other and meshed with each on heartbeats."""
    nodes = []
    for i in range(count):
        host = await stack.enter_async_context(open_host(HostConfig(identity=Identity(bytes([first_seed + i]) * 32))))
        nodes.append(await stack.enter_async_context(open_gossip(host, run)))
    target = nodes[0]
    for other in nodes[1:]:
        await target.host.connect(other.host.multiaddrs[0])
        await target.wait_for_mesh(other.host.peer_id, "heartbeat")
    return nodes
