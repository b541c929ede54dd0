"""Events of the trainer role: its steps, its gate, its versions and evaluations (swarm.roles.trainer)."""

from __future__ import annotations

from dataclasses import dataclass, field

from swarm.event_types.base import Event, optional
from swarm.readable import readable_lags, readable_text


@dataclass(frozen=True, kw_only=True)
class TrainStep(Event):
    """One optimizer step: what it trained on, so a flat reward can be told from an empty batch."""

    kind = "train_step"
    step: int  # steps done before this one
    reward: float | None  # mean reward of the batch's groups; None when no group was inside the async window
    stage: str  # the curriculum stage
    version: int = 0  # the trainer's version after the step
    groups: int = 0  # quorum-accepted groups in the batch
    refused: int = 0  # groups the training run refused (stale, replayed)
    trained_groups: int | None = None  # groups with a learning signal (a reward spread)
    zero_advantage_groups: int = 0  # groups whose completions all scored alike
    lags: dict[int, int] = field(default_factory=dict)  # versions behind the newest -> groups
    group_rewards: list[float] = field(default_factory=list)  # each group's mean reward
    mean_tokens: float = 0.0  # tokens per completion
    hit_length: int = 0  # completions cut at the length limit
    completions: int = 0  # completions in the batch
    entropy: float = 0.0  # policy entropy, token mean
    skipped: str = ""  # why the optimizer skipped the step, if it did
    loss: float | None = None  # the GRPO loss
    kl: float | None = None  # KL to the initial policy, token mean
    lr: float | None = None  # the learning rate
    step_seconds: float | None = None  # seconds the optimizer step took
    workers: list[str] = field(default_factory=list)  # the workers whose groups were trained on
    gate: dict[str, int] = field(default_factory=dict)  # the gate's counts the step trained from
    sample: str = ""  # the best-rewarded completion, decoded, cut to 80 characters

    def line(self) -> str:
        if self.reward is None:
            return f"step {self.step}: no group inside the async window ({self.refused} refused, stage {self.stage})"
        return (f"step {self.step}: reward {self.reward:.3f} on {self.groups} quorum-accepted groups "
                f"({self.trained_groups} with a learning signal, lags: {readable_lags(self.lags)}, "
                f"{self.mean_tokens} tokens/completion, {self.hit_length}/{self.completions} cut at the "
                f"limit; stage {self.stage}) "
                f"best: {readable_text(self.sample)}")


@dataclass(frozen=True, kw_only=True)
class TrainerWaiting(Event):
    """The trainer waits for a batch (swarm.roles.batch_wait): what is ready and what is on its way."""

    kind = "trainer_waiting"
    waited_s: float  # seconds waited for this batch
    ready: int  # accepted groups ready
    wanted: int  # groups a step takes
    awaiting_votes: int  # groups waiting for their quorum
    newest_version: int  # the newest version published
    counts: dict[str, int]  # the gate's tally by outcome

    def line(self) -> str:
        return (f"waiting {self.waited_s} s for a batch: {self.ready}/{self.wanted} accepted groups "
                f"ready, {self.awaiting_votes} awaiting votes, newest version v{self.newest_version}")


@dataclass(frozen=True, kw_only=True)
class Gate(Event):
    """The rollout gate's counts changed (at most once a second)."""

    kind = "gate"
    waiting: int  # groups awaiting votes
    ready: int  # accepted groups not yet trained on
    counts: dict[str, int]  # cumulative counts by outcome


@dataclass(frozen=True, kw_only=True)
class Trained(Event):
    """Training is over: the final policy, the gate's counts, held-out scores and the banned workers."""

    kind = "trained"
    steps: int  # steps done
    version: int  # the final version
    final: str  # the final policy's directory
    gate: dict[str, int]  # the gate's cumulative counts
    heldout: dict[str, float]  # held-out accuracy by when ("before", "during", "after", "constant_answer")
    banned: list[str]  # workers banned by reputation or evidence

    def line(self) -> str:
        return f"training done: {self.steps} steps, final policy v{self.version} in {self.final}"


@dataclass(frozen=True, kw_only=True)
class WorkerBanned(Event):
    """A worker is banned: its rollouts are no longer counted (the trainer) or checked (a validator)."""

    kind = "worker_banned"
    worker: str  # the worker's peer id
    by: str | None = optional()  # the trainer's rule: "near_ties" or "reputation"; a validator names none
    reason: str  # why, for a person


@dataclass(frozen=True, kw_only=True)
class Evaluated(Event):
    """Held-out accuracy of the trainer's live policy."""

    kind = "evaluated"
    when: str  # "before", "during" or "after" training
    step: int  # the step it was scored at
    accuracy: float  # the fraction answered right
    n: int  # prompts scored
    message: str  # the line a person reads


@dataclass(frozen=True, kw_only=True)
class TrainerDevice(Event):
    """The device the trainer trains on."""

    kind = "trainer_device"
    device: str  # e.g. "cpu", "cuda:0"
    message: str  # the line a person reads


@dataclass(frozen=True, kw_only=True)
class Resumed(Event):
    """The trainer resumed from its checkpoint and sends its weights again under a new version."""

    kind = "resumed"
    step: int  # the step resumed at
    version: int  # the version the weights go out as
    message: str  # the line a person reads


@dataclass(frozen=True, kw_only=True)
class PublishingEarly(Event):
    """The newest version cannot bring the next batch, so the current weights go out as a new version."""

    kind = "publishing_early"
    version: int  # the new version
    message: str  # why, for a person


@dataclass(frozen=True, kw_only=True)
class NumberedPast(Event):
    """Peers hold a version as new as the trainer's from an earlier process; its weights go out past it."""

    kind = "numbered_past"
    held: int  # the newest version the swarm holds
    version: int  # the version the weights go out as
    message: str  # the line a person reads


@dataclass(frozen=True, kw_only=True)
class Published(Event):
    """A policy version went out (the trainer, `swarm publish`, the benches)."""

    kind = "published"
    version: int  # the policy version
    id: str | None = optional()  # the manifest id, hex
    bytes: int | None = optional()  # the policy's size
    validators: int | None = optional()  # the validators its run spec names (a trainer's version)
    stage: str | None = optional()  # the curriculum stage it generates at (a trainer's version)
    trainer_key: str | None = optional()  # the signing key, hex (`swarm publish`)

    def line(self) -> str:
        details = [f"{self.validators} validators" if self.validators is not None else "",
                   f"stage {self.stage}" if self.stage is not None else ""]
        size = (self.bytes or 0) / 2**20
        return f"published policy v{self.version} ({size:.2f} MiB{''.join(f', {d}' for d in details if d)})"


@dataclass(frozen=True, kw_only=True)
class ValidatorIgnored(Event):
    """A validator was heard that --validator-key does not list: its votes do not count."""

    kind = "validator_ignored"
    peer: str  # its peer id
    message: str  # the line a person reads


@dataclass(frozen=True, kw_only=True)
class WaitingForValidators(Event):
    """The first version waits for a quorum of validators to be heard."""

    kind = "waiting_for_validators"
    known: int  # validators heard
    quorum: int  # validators the quorum needs
    waited_s: float  # seconds waited so far
    message: str  # the line a person reads
