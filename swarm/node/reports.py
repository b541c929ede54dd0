"""What a node reports about its policy transfers: a progress event per version every status period."""

from __future__ import annotations

import trio

from swarm.event_types import TransferProgress
from swarm.node.state import Node


async def report_progress(node: Node) -> None:
    """Each version's transfer every status period: pieces held, and the rates since the last report."""
    last: dict[bytes, tuple[int, int, float]] = {}
    while True:
        await trio.sleep(node.config.peer.status_every_s)
        now = trio.current_time()
        for mid, p in list(node.mirror.policies.items()):
            if p.service is None:
                continue
            prog = p.service.progress()
            up, down = sum(prog.bytes_up.values()), sum(prog.bytes_down.values())
            prev_up, prev_down, prev_t = last.get(mid, (0, 0, now - node.config.peer.status_every_s))
            dt = max(1e-6, now - prev_t)
            last[mid] = (up, down, now)
            node.events.emit(TransferProgress(version=p.manifest.version, pieces=prog.pieces_done,
                             total=prog.pieces_total, up_mib_s=round((up - prev_up) / dt / 2**20, 2),
                             down_mib_s=round((down - prev_down) / dt / 2**20, 2), peers=len(p.service.peers),
                             up_bytes=up, down_bytes=down))
