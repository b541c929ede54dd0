"""When the trainer trains and when it sends a version out early: the decisions of its wait for a batch.

Pure: plain values in (what the gate holds, GateCounts; what the trainer hears of its swarm, SwarmFacts; the clock),
a decision out; the trainer role (swarm.roles.trainer) reads those values off its gate and peers, waits and
publishes. A step wants `prompts_per_step` accepted groups, but a version brings only what its workers answer, so
the trainer must tell when waiting longer brings nothing: then it trains on what it holds or sends the weights out
again as a new version, whose answers fill the batch.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from swarm.event_types import TrainerWaiting


@dataclass(frozen=True)
class GateCounts:
    """What the trainer's gate holds now, read after it expired what fell out of the async window."""

    ready: int
    """Accepted groups the next step may train on."""
    awaiting_votes: int
    """Groups whose quorum is still open: each may yet complete the batch."""
    async_level: int
    """How many versions behind the newest a group may be; 0 is synchronous (a new version expires what is ready)."""
    newest: int
    """The newest version the gate knows."""
    prompts_per_worker: int
    """What each inference peer answers per version, as the newest version says."""
    answered_in_full: bool = False
    """Every inference peer heard from (banned ones aside) sent all its groups for the newest version."""
    tally: Mapping[str, int] = field(default_factory=dict)
    """The gate's counts by outcome, for the status view."""


@dataclass(frozen=True)
class SwarmFacts:
    """What the trainer hears of its swarm now, for the decision to send a version out before the next step."""

    quorum_here: bool
    """At least a quorum of validators is heard from."""
    workers_known: bool
    """Some inference peer is heard from: a new version only helps if someone will answer it."""
    validators_departed: int
    """How many of the validators the newest version names are no longer heard from."""
    validators_changed: bool
    """Validators are heard from and differ from those the newest version names."""
    newest_held: int
    """The newest version any peer holds (only the run key's versions are adopted), or -1."""
    trained_since_publish: bool
    """Steps were trained since the newest version went out (its workers answered it already)."""


@dataclass
class BatchWait:
    """The trainer's wait for its next batch: bounded, and visible while it lasts.

    Why bounded: a step needs `wanted` accepted groups, but the groups of the current version are all the workers
    will send until the trainer publishes the next one. One lost rollout or vote (gossip drops messages on a
    loaded machine) would leave it a group short for ever, and nothing in the swarm would move again. So once no
    quorum is open (every vote the gate waits for has come or timed out) and no group was accepted for
    `patience_s`, it trains on the groups it has. Why visible: a wait longer than `report_every_s` is reported
    with what it waits on (ready groups, groups still awaiting votes, the newest version), never silent.
    """

    wanted: int
    since: float
    patience_s: float = 30.0
    retry_after_s: float = 120.0
    """Starved this long, the trainer sends the same weights out again: rollouts or votes were lost for good."""
    report_every_s: float = 20.0
    reported_at: float = 0.0
    have: int = 0
    changed_at: float = 0.0

    def ready(self, gate: GateCounts, now: float) -> bool:
        """Whether to train now: on a full batch, or on the groups it has once none are on their way: after
        `patience_s` of quiet, or at once when synchronous and every worker answered the newest version in full
        (a new version would expire what it holds, and waiting brings nothing)."""
        have = gate.ready
        if have != self.have:
            self.have, self.changed_at = have, now
        short_for_good = gate.answered_in_full and not gate.awaiting_votes and gate.async_level == 0
        return have >= self.wanted or (have > 0 and (self._quiet(gate, now) or short_for_good))

    def starved(self, gate: GateCounts, now: float) -> bool:
        """Nothing to train on and nothing on its way for `patience_s`: the workers have answered the current
        version and wait for the next one (see TrainingRun.publish_early)."""
        return self.have == 0 and self._quiet(gate, now)

    def starved_long(self, gate: GateCounts, now: float) -> bool:
        """Starved for `retry_after_s`: whatever the newest version's rollouts became, none will come now (a
        validator that died holding its votes, a worker that died before answering)."""
        return self.starved(gate, now) and now - max(self.since, self.changed_at) >= self.retry_after_s

    def restart(self, now: float) -> None:
        """Wait afresh (after publishing early: the new version's groups need time to come)."""
        self.since = self.changed_at = now

    def _quiet(self, gate: GateCounts, now: float) -> bool:
        return not gate.awaiting_votes and now - max(self.since, self.changed_at) >= self.patience_s

    def should_report(self, now: float) -> bool:
        if now - max(self.since, self.reported_at) < self.report_every_s:
            return False
        self.reported_at = now
        return True

    def status(self, gate: GateCounts, now: float) -> TrainerWaiting:
        return TrainerWaiting(waited_s=round(now - self.since, 1), ready=gate.ready, wanted=self.wanted,
                              awaiting_votes=gate.awaiting_votes, newest_version=gate.newest, counts=dict(gate.tally))


def why_publish_now(gate: GateCounts, swarm: SwarmFacts, waiting: BatchWait, now: float) -> str | None:
    """Why a new version should go out before the next step, or None: at once (_why_at_once), or once starved,
    with nothing to train on and nothing on its way for `patience_s` (_why_starved)."""
    why = _why_at_once(gate, swarm, waiting)
    if why is None and waiting.starved(gate, now):
        why = _why_starved(gate, swarm, waiting, now)
    return why


def _why_at_once(gate: GateCounts, swarm: SwarmFacts, waiting: BatchWait) -> str | None:
    """No vote is awaited and either validators the newest version names have left (its rollouts assigned to them
    are refused on arrival, so waiting on it only wastes the workers' generation) or every inference peer answered
    it in full (nothing more will come: fewer workers x prompts per worker than a batch). A trainer holding part of
    a batch does not wait `patience_s` for more; it trains on that part at once when synchronous, where a new
    version would expire it (see BatchWait.ready)."""
    keeps_ready = gate.async_level > 0 or not gate.ready  # synchronous, a new version expires what is ready
    if gate.awaiting_votes or not (swarm.quorum_here and keeps_ready and swarm.workers_known):
        return None
    if left := swarm.validators_departed:
        return f"{left} of the validators it names left, and the rollouts assigned to them can never be accepted"
    if gate.answered_in_full:
        return (f"every inference peer sent its {gate.prompts_per_worker} groups for it, and the batch still "
                f"needs {waiting.wanted - waiting.have} of {waiting.wanted}")
    return None


def _why_starved(gate: GateCounts, swarm: SwarmFacts, waiting: BatchWait, now: float) -> str | None:
    """Starved: when peers hold a newer version than this process published, when steps were trained since the
    newest version (its workers answered it already), when the validators it names are not the ones around now (a
    version naming none can never be accepted), or, with workers around, when nothing came for `retry_after_s`
    (its rollouts or votes were lost)."""
    quiet = f"no rollouts for {waiting.patience_s:g} s and none awaiting votes"
    if swarm.newest_held > gate.newest:
        return f"{quiet}; peers hold v{swarm.newest_held}, published by an earlier process of this run, and answer that"
    if swarm.trained_since_publish:
        return f"{quiet}; the workers have answered it"
    if swarm.validators_changed:
        return f"{quiet}; it names other validators than those here"
    if waiting.starved_long(gate, now) and swarm.workers_known:
        return f"nothing came for it in {waiting.retry_after_s:g} s (its rollouts or votes were lost)"
    return None
