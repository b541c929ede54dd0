"""Events of the inference and validator roles: rollouts generated and votes cast (swarm.roles)."""

from __future__ import annotations

from dataclasses import dataclass

from swarm.event_types.base import Event, optional


@dataclass(frozen=True, kw_only=True)
class Skipped(Event):
    """A version (or one group) was not answered, and why; not an error."""

    kind = "skipped"
    version: int | None = optional()  # the version skipped; none when one group of it was not published
    message: str  # why


@dataclass(frozen=True, kw_only=True)
class Generating(Event):
    """A worker starts generating its prompts for a version."""

    kind = "generating"
    version: int  # the policy version
    prompts: int  # prompts it answers


@dataclass(frozen=True, kw_only=True)
class Generated(Event):
    """A worker published its groups for a version."""

    kind = "generated"
    version: int  # the policy version
    groups: int  # groups published
    completions: int = 0  # completions in them
    tokens: int = 0  # tokens generated
    mean_reward: float = 0.0  # the mean reward it claims

    def line(self) -> str:
        return f"generated {self.groups} groups with v{self.version} (claimed mean reward {self.mean_reward})"


@dataclass(frozen=True, kw_only=True)
class RewardRefused(Event):
    """A validator refuses to vote on a run whose reward function it does not run."""

    kind = "reward_refused"
    reward: str  # the run spec's reward function
    expected: str  # the hash the run spec names
    message: str  # the line a person reads


@dataclass(frozen=True, kw_only=True)
class ValidatorDevice(Event):
    """The device a validator's prefills run on."""

    kind = "validator_device"
    device: str  # e.g. "cpu", "cuda:0"
    message: str  # the line a person reads


@dataclass(frozen=True, kw_only=True)
class RejectedRollout(Event):
    """A validator voted to reject a rollout."""

    kind = "rejected_rollout"
    reason: str  # why, "<check>: <details>"

    def line(self) -> str:
        return f"voted to reject a rollout: {self.reason}"


@dataclass(frozen=True, kw_only=True)
class Validated(Event):
    """A validator's cumulative verdicts, after each batch of votes."""

    kind = "validated"
    checked: int = 0  # rollouts checked (one vote each)
    accepted: int = 0  # of them accepted
    rejected: int = 0  # of them rejected
    skipped_banned: int = 0  # groups of banned workers not checked

    def line(self) -> str:
        return f"validated {self.checked} rollouts so far: {self.accepted} accepted, {self.rejected} rejected"
