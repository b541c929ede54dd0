"""Which rollout groups the trainer accepts: a pure decision on (group, trainer's versions, async level, consumed).

Why separate and pure: the same rule guards the local loop and the swarm's quorum-accepted stream, and each
refusal carries a reason the operator can read (a rollout from a version the trainer never published is either a
bug or an attack; one beyond the async window is merely late).
"""

from __future__ import annotations

from collections.abc import Container
from dataclasses import dataclass

from verify.rollout import RolloutGroup


@dataclass(frozen=True)
class Window:
    """What the trainer knows when a group arrives."""

    run: str
    latest_version: int  # newest published policy version
    async_level: int  # a group may come from latest_version - async_level .. latest_version
    published: frozenset[int]  # every version this trainer has published (and could have generated a group)


def refusal(group: RolloutGroup, window: Window, consumed: Container[str]) -> str | None:
    """None when the group may be trained on, else one sentence saying why not."""
    if group.run != window.run:
        return f"rollout belongs to run {group.run!r}, not {window.run!r}"
    v = group.policy_version
    lag = window.latest_version - v
    if lag > window.async_level:  # checked first: an old version's files are pruned, which is not "unknown"
        return f"rollout from version {v} is {lag} versions old, beyond the async level {window.async_level}"
    if v > window.latest_version or v not in window.published:
        return f"rollout comes from unknown policy version {v} (latest published is {window.latest_version})"
    if group.rollout_id().hex() in consumed:
        return "rollout was already trained on"
    return None
