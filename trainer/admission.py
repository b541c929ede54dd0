"""Which rollout groups the trainer accepts: a pure decision on (group, trainer's versions, async level, consumed).

Why separate and pure: the same rule guards the local loop and the swarm's quorum-accepted stream, and each
refusal carries a reason the operator can read (a rollout from a version the trainer never published is either a
bug or an attack; one beyond the async window is merely late).
"""

from __future__ import annotations

from collections.abc import Container, Mapping
from dataclasses import dataclass

from verify.rollout import RolloutGroup


@dataclass(frozen=True)
class GenerationContract:
    """What a version's workers must generate with: the generation settings the trainer published with it (its
    generation.json, and in the swarm the signed manifest's). The trainer trains every row of a version with
    these, never with what a group says about itself."""

    group_size: int  # completions per prompt
    temperature: float  # sampling temperature: also the temperature of the loss's logprobs
    max_new_tokens: int  # generation limit: also the constant of the loss normaliser

    @classmethod
    def from_generation(cls, generation: Mapping) -> "GenerationContract":
        return cls(int(generation["group_size"]), float(generation["temperature"]), int(generation["max_new_tokens"]))


@dataclass(frozen=True)
class Window:
    """What the trainer knows when a group arrives."""

    run: str
    latest_version: int  # newest published policy version
    async_level: int  # a group may come from latest_version - async_level .. latest_version
    published: frozenset[int]  # every version this trainer has published (and could have generated a group)
    contracts: Mapping[int, GenerationContract]  # version -> the settings it was published with


def refusal(group: RolloutGroup, window: Window, consumed: Container[str]) -> str | None:
    """None when the group may be trained on, else one sentence saying why not. `consumed` holds the hex slot keys
    (verify.rollout.Slot) already trained on: a slot is trained once, whatever bytes come for it again."""
    if group.run != window.run:
        return f"rollout belongs to run {group.run!r}, not {window.run!r}"
    v = group.policy_version
    lag = window.latest_version - v
    if lag > window.async_level:  # checked first: an old version's files are pruned, which is not "unknown"
        return f"rollout from version {v} is {lag} versions old, beyond the async level {window.async_level}"
    if v > window.latest_version or v not in window.published or v not in window.contracts:
        return f"rollout comes from unknown policy version {v} (latest published is {window.latest_version})"
    broken = contract_breach(group, window.contracts[v])
    if broken:
        return broken
    if group.slot().key().hex() in consumed:
        return "rollout's slot was already trained on"
    return None


def contract_breach(group: RolloutGroup, contract: GenerationContract) -> str:
    """Which of its version's generation settings the group does not follow ("" when it follows them all)."""
    if len(group.completions) != contract.group_size:
        return f"rollout holds {len(group.completions)} completions, its version's group size is {contract.group_size}"
    if group.temperature != contract.temperature:
        return f"rollout says temperature {group.temperature}, its version's is {contract.temperature}"
    if group.max_new_tokens != contract.max_new_tokens or any(
            len(c.tokens) > contract.max_new_tokens for c in group.completions):
        return f"rollout breaks its version's generation limit of {contract.max_new_tokens} tokens"
    return ""
