"""What moving the policy cost in a `swarm sim` run: bytes each peer fetched per version, against a full copy.

Read back from the events like the timeline (swarm.sim.timeline): every peer reports, per version, the bytes it
received (`progress`, down_bytes, running totals: the last report counts), and the trainer reports each version's
full size and its patch's (`published`). A peer's figure covers every copy of every piece it received, duplicates
of the endgame included, which is what its link carried.
"""

from __future__ import annotations


def transfer(events: list[dict]) -> dict:
    """Mean bytes fetched per peer per version, the full copy's and the patch's sizes, and the mean seconds per
    trainer step."""
    received: dict[tuple[str, int], int] = {}
    for e in events:
        if e["event"] == "progress" and "down_bytes" in e and e.get("peer") != "trainer":
            received[(e.get("peer"), e["version"])] = e["down_bytes"]
    published = [e for e in events if e["event"] == "published"]
    patches = [e["patch_bytes"] for e in published if e.get("patch_bytes")]
    steps = [e["t"] for e in events if e["event"] == "train_step" and isinstance(e.get("t"), (int, float))]
    fetched = [b for b in received.values() if b > 0]
    return {
        "bytes_per_peer_per_version": round(sum(fetched) / len(fetched)) if fetched else 0,
        "full_copy_bytes": max((e.get("bytes", 0) for e in published), default=0),
        "patch_bytes_mean": round(sum(patches) / len(patches)) if patches else 0,
        "versions_as_patches": len(patches),
        "seconds_per_step": round((steps[-1] - steps[0]) / (len(steps) - 1), 2) if len(steps) > 1 else None,
    }
