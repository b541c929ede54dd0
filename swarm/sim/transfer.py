"""What moving the policy cost in a `swarm sim` run: bytes each peer fetched per version, against a full copy.

Read back from the events like the timeline (swarm.sim.timeline): every peer reports, per version, the bytes it
received (TransferProgress.down_bytes, running totals: the last report counts), and the trainer reports each
version's full size and its patch's (Published). A peer's figure covers every copy of every piece it received,
duplicates of the endgame included, which is what its links carried.
"""

from __future__ import annotations

from swarm.event_types import Published, TrainStep, TransferProgress
from swarm.events import Emitted


def transfer(events: list[Emitted]) -> dict:
    """Mean bytes fetched per peer per version, the full copy's and the patches' sizes, and the mean seconds per
    trainer step."""
    received: dict[tuple[str | None, int], int] = {}
    for e in events:
        if isinstance(e.event, TransferProgress) and e.peer != "trainer":
            received[(e.peer, e.event.version)] = e.event.down_bytes
    published = [e.event for e in events if isinstance(e.event, Published)]
    patches = [p.patch_bytes for p in published if p.patch_bytes]
    steps = [e.t for e in events if isinstance(e.event, TrainStep)]
    fetched = [b for b in received.values() if b > 0]
    return {
        "bytes_per_peer_per_version": round(sum(fetched) / len(fetched)) if fetched else 0,
        "full_copy_bytes": max((p.bytes or 0 for p in published), default=0),
        "patch_bytes_mean": round(sum(patches) / len(patches)) if patches else 0,
        "versions_as_patches": len(patches),
        "seconds_per_step": round((steps[-1] - steps[0]) / (len(steps) - 1), 2) if len(steps) > 1 else None,
    }
