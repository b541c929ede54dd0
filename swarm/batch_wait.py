"""When the trainer trains and when it sends a version out early: the decisions of its wait for a batch.

Pure: the gate's counts, what the publisher hears of its peers and the clock in, a decision out; the trainer role
(swarm.role_trainer) does the waiting and the publishing. A step wants `prompts_per_step` accepted groups, but a
version brings only what its workers answer, so the trainer must tell when waiting longer brings nothing: then it
trains on what it holds or sends the weights out again as a new version, whose answers fill the batch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from swarm.role_trainer import SwarmPublisher
    from swarm.rollout_gate import RolloutGate


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

    def ready(self, gate: RolloutGate, now: float, answered_in_full: bool = False) -> bool:
        """Whether to train now: on a full batch, or on the groups it has once none are on their way: after
        `patience_s` of quiet, or at once when synchronous and every worker answered the newest version in full
        (`answered_in_full`; a new version would expire what it holds, and waiting brings nothing)."""
        have = gate.expire()
        if have != self.have:
            self.have, self.changed_at = have, now
        short_for_good = answered_in_full and not gate.pending and gate.async_level == 0
        return have >= self.wanted or (have > 0 and (self._quiet(gate, now) or short_for_good))

    def starved(self, gate: RolloutGate, now: float) -> bool:
        """Nothing to train on and nothing on its way for `patience_s`: the workers have answered the current
        version and wait for the next one (see TrainingRun.publish_early)."""
        return self.have == 0 and self._quiet(gate, now)

    def starved_long(self, gate: RolloutGate, now: float) -> bool:
        """Starved for `retry_after_s`: whatever the newest version's rollouts became, none will come now (a
        validator that died holding its votes, a worker that died before answering)."""
        return self.starved(gate, now) and now - max(self.since, self.changed_at) >= self.retry_after_s

    def restart(self, now: float) -> None:
        """Wait afresh (after publishing early: the new version's groups need time to come)."""
        self.since = self.changed_at = now

    def _quiet(self, gate: RolloutGate, now: float) -> bool:
        return not gate.pending and now - max(self.since, self.changed_at) >= self.patience_s

    def should_report(self, now: float) -> bool:
        if now - max(self.since, self.reported_at) < self.report_every_s:
            return False
        self.reported_at = now
        return True

    def status(self, gate: RolloutGate, now: float) -> dict:
        return {"waited_s": round(now - self.since, 1), "ready": len(gate.accepted), "wanted": self.wanted,
                "awaiting_votes": len(gate.pending), "newest_version": gate.newest, "counts": dict(gate.counts)}


def why_publish_now(node, run, publisher: SwarmPublisher, gate: RolloutGate, waiting: BatchWait,
                     now: float) -> str | None:
    """Why a new version should go out before the next step, or None: at once (_why_at_once), or once starved,
    with nothing to train on and nothing on its way for `patience_s` (_why_starved)."""
    why = _why_at_once(node, publisher, gate, waiting)
    if why is None and waiting.starved(gate, now):
        why = _why_starved(node, run, publisher, gate, waiting, now)
    return why


def _why_at_once(node, publisher: SwarmPublisher, gate: RolloutGate, waiting: BatchWait) -> str | None:
    """No vote is awaited and either validators the newest version names have left (its rollouts assigned to them
    are refused on arrival, so waiting on it only wastes the workers' generation) or every inference peer answered
    it in full (nothing more will come: fewer workers x prompts per worker than a batch). A trainer holding part of
    a batch does not wait `patience_s` for more; it trains on that part at once when synchronous, where a new
    version would expire it (see BatchWait.ready)."""
    newest = gate.specs[gate.newest]
    quorum_here = len(publisher.known_validators()) >= node.config.trainer.quorum
    keeps_ready = gate.async_level > 0 or not gate.accepted  # synchronous, a new version expires what is ready
    if gate.pending or not (quorum_here and keeps_ready and publisher.workers_known()):
        return None
    if left := publisher.validators_departed(newest):
        return f"{left} of the validators it names left, and the rollouts assigned to them can never be accepted"
    if answered_in_full(gate, publisher):
        return (f"every inference peer sent its {newest.prompts_per_worker} groups for it, and the batch still "
                f"needs {waiting.wanted - waiting.have} of {waiting.wanted}")
    return None


def _why_starved(node, run, publisher: SwarmPublisher, gate: RolloutGate, waiting: BatchWait,
                 now: float) -> str | None:
    """Starved: when peers hold a newer version than this process published, when steps were trained since the
    newest version (its workers answered it already), when the validators it names are not the ones around now (a
    version naming none can never be accepted), or, with workers around, when nothing came for `retry_after_s`
    (its rollouts or votes were lost)."""
    quiet = f"no rollouts for {waiting.patience_s:g} s and none awaiting votes"
    if (held := newest_in_swarm(node)) > gate.newest:
        return f"{quiet}; peers hold v{held}, published by an earlier process of this run, and answer that"
    if run.trained_since_publish:
        return f"{quiet}; the workers have answered it"
    if publisher.validators_changed(gate.specs[gate.newest]):
        return f"{quiet}; it names other validators than those here"
    if waiting.starved_long(gate, now) and publisher.workers_known():
        return f"nothing came for it in {waiting.retry_after_s:g} s (its rollouts or votes were lost)"
    return None


def answered_in_full(gate: RolloutGate, publisher: SwarmPublisher) -> bool:
    """Whether every inference peer heard from (banned ones aside) sent all its groups for the newest version."""
    return gate.answered_in_full(gate.newest, publisher.known_workers())


def newest_in_swarm(node) -> int:
    """The newest version among the manifests this peer adopted (only the run key's are adopted), or -1."""
    return max((p.manifest.version for p in node.mirror.policies.values()), default=-1)
