"""The trainer's rollout gate: rollouts and votes in, quorum-accepted groups out, the rest refused with a reason.

Sans-IO (swarm.roles.trainer moves the bytes), so every decision is tested without sockets. One slot, one rollout
(verify.slots): the gate opens a quorum for the first group of a slot and refuses every other group for it, and a
worker's groups for one version fill at most the spec's prompts per worker slots (SLOTS_FULL), so what one identity
holds here and asks of the validators is bounded by its assignment, not by the rate it sends at.
A worker's history decides what one group cannot (swarm.roles.gate_evidence): the near-tie rows of the votes that
settle each group add up per worker, and a worker the sequential test bans has its groups refused (`near_ties`); a
group whose two rows disagree is refused (`disputed`). Identities are free, so an unproven worker's groups train
beside proven workers' only within a bounded share of each batch (swarm.roles.gate_probation), and a validator the
reputation banned has its votes refused and is left out of the next version (the trainer's SwarmPublisher).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from swarm.policy.runspec import RunSpec
from swarm.roles import gate_state
from swarm.roles.gate_evidence import NEAR_TIES, GateEvidence
from swarm.roles.gate_probation import Probation, ProbationConfig
from verify.quorum import Outcome, QuorumConfig, QuorumTracker, Settlement
from verify.reputation import Reputation
from verify.rollout import RolloutGroup
from verify.slots import ECHO, RESUBMITTED, SlotLedger
from verify.votes import Vote

SLOT_TAKEN = "another group for an answered slot"
DISPUTED = "disputed"
TOO_STALE = "too stale"
SLOTS_FULL = "more slots than the worker was assigned"
"""A group for a new slot of a version whose worker already filled the spec's prompts per worker: an honest worker
answers exactly its assigned prompts, one group each (swarm.roles.inference), so the group is dishonest; it costs its
worker and is kept nowhere, and one identity holds at most that many quorums, slots and answers per version."""
JUDGED_BEHIND = 4
"""Versions behind the async window whose rollouts are still judged, never trained on. Why: a cheating worker that
is always late (a slow machine, or on purpose) would otherwise have every false claim refused as too stale before
a quorum settles it, and never be banned; its votes are evidence whether or not its rollouts come in time. A
validator votes only on versions inside its own window, so a late honest rollout gets content votes or none (the
quorum times out and scores nobody). Judged-only rollouts are bounded: at most the version's prompts per worker for
each worker, and MAX_JUDGED_ONLY pending in all; past either, a late rollout is refused unjudged."""
MAX_JUDGED_ONLY = 1024


@dataclass
class RolloutGate:
    """Admits rollouts to the quorum and releases those a quorum accepted; refuses the rest with a reason."""

    run: str
    replicas: int
    quorum: int
    timeout_s: float = 120.0
    specs: dict[int, RunSpec] = field(default_factory=dict)  # version -> spec it was published with
    newest: int = -1
    async_level: int = 2
    pending: dict[bytes, RolloutGroup] = field(default_factory=dict)  # rollout id -> RolloutGroup awaiting votes
    accepted: list = field(default_factory=list)
    counts: dict[str, int] = field(default_factory=dict)
    probation_config: ProbationConfig = field(default_factory=ProbationConfig)

    def __post_init__(self) -> None:

        self.tracker = QuorumTracker(QuorumConfig(self.replicas, self.quorum, self.timeout_s))
        self.reputation = Reputation()
        self.slots = SlotLedger()  # the slots opened, for versions inside the judging window: one rollout each
        self.judged_only: set[bytes] = set()  # pending rollouts too stale to train on, judged for their worker
        self.late_slots: dict[tuple[int, str], int] = {}  # (version, worker) -> late rollouts judged
        self.present: set[bytes] = set()  # validators heard from at the last on_validators
        self.answers: dict[int, dict[str, set[bytes]]] = {}  # version -> worker -> slots of its groups received
        self._pruned_below: int | None = None  # the window floor forget_old last pruned to
        self.evidence = GateEvidence(self.replicas)  # each worker's near-tie flips over the groups settled here
        self.new_bans: list[tuple[str, str]] = []  # (worker, reason) banned by its near-ties, not yet reported
        self.probation = Probation(self.probation_config)  # each worker's accepted groups, and the unproven share

    def is_banned(self, worker: str) -> bool:
        """Banned for its rejected rollouts (reputation) or for its near-tie flips (evidence)."""
        return self.reputation.is_banned(worker) or self.evidence.is_banned(worker)

    def validator_banned(self, key: bytes) -> bool:
        """A validator the reputation banned for votes against the settled outcomes: its votes no longer count."""
        return self.reputation.is_banned(key)

    def snapshot(self) -> dict:
        """The gate's judgements (histories, bans, reputation, probation) as JSON values for the trainer's
        checkpoint (swarm.roles.gate_state)."""
        return gate_state.snapshot(self.evidence, self.reputation, self.probation)

    def keep_in(self, extra: dict, *, due: bool) -> None:
        """Put the judgements into a trainer state's `extra` when its next step writes a checkpoint (`due`). Why
        not every step: a snapshot of full tables (10,000 workers each, 5.4 MB of JSON) takes about half a second
        on the event loop."""
        if due:
            extra["gate"] = self.snapshot()

    def restore(self, data: object) -> None:
        """Take back a checkpoint's judgements (validated; None leaves the gate as it is)."""
        gate_state.restore(self.evidence, self.reputation, self.probation, data)

    def take_new_bans(self) -> list[tuple[str, str]]:
        """The (worker, reason) pairs the near-tie test banned since the last call: each is reported once."""
        bans, self.new_bans = self.new_bans, []
        return bans

    def count(self, what: str, n: int = 1) -> None:
        """Add to one of the gate's counters (refusals, votes, outcomes): the trainer's report shows them all."""
        self.counts[what] = self.counts.get(what, 0) + n

    def on_rollout(self, group: RolloutGroup, now: float) -> str:
        """Open a quorum for a well-formed, in-window rollout; returns 'opened' or why it was refused.

        One slot, one rollout: a second group for a slot already opened is refused whatever its bytes, and unless
        it is the very same bytes again (a gossip echo) it counts against its worker, as a rejected rollout does.
        So does a group for a slot past the worker's prompts per worker (SLOTS_FULL).
        """
        rid = group.rollout_id()
        reason = self._refusal(group, rid)
        in_window = group.policy_version >= self.newest - self.async_level
        if group.run == self.run and group.policy_version in self.specs and in_window:  # a banned worker's too
            self._note_answer(group)
        if reason == TOO_STALE and self._judgeable(group):
            self.judged_only.add(rid)
            self._open(group, rid, now)
        if reason:
            self.count(f"refused:{reason}")
            if reason in (SLOT_TAKEN, SLOTS_FULL):
                self.reputation.record(group.worker, False)
            return reason
        self._open(group, rid, now)
        self.count("opened")
        return "opened"

    def _open(self, group: RolloutGroup, rid: bytes, now: float) -> None:
        self.slots.record(group, rid)
        self.pending[rid] = group
        validators = self.specs[group.policy_version].validators_for(group.worker)
        _, settlements = self.tracker.open(rid, group.slot().key(), validators, now)
        for s in settlements:
            self._settle(s)

    def _refusal(self, group: RolloutGroup, rid: bytes) -> str:

        if group.run != self.run:
            return "wrong run"
        seen = self.slots.classify(group, rid)
        if seen == ECHO:
            return "duplicate"
        if self.reputation.is_banned(group.worker):
            return "worker banned"
        if self.evidence.is_banned(group.worker):
            return NEAR_TIES
        if seen == RESUBMITTED:
            return SLOT_TAKEN
        if group.policy_version < self._judging_floor():
            return TOO_STALE
        if group.policy_version not in self.specs:
            return "unknown policy version"
        if group.step != group.policy_version:
            return "assignment step differs from the policy version"
        if not self.specs[group.policy_version].quorum_reachable(group.worker):
            return "fewer validators than the quorum"  # not the worker's fault: no penalty
        if group.policy_version < self.newest - self.async_level:
            return TOO_STALE  # judged all the same (on_rollout), within the worker's prompts (_judgeable)
        if self._slots_full(group):
            return SLOTS_FULL
        return ""

    def _taken(self, group: RolloutGroup) -> set[bytes]:
        """The slots of the group's worker answered for the group's version inside the async window."""
        return self.answers.get(group.policy_version, {}).get(group.worker, set())

    def _slots_full(self, group: RolloutGroup) -> bool:
        """Whether an in-window `group` is for a new slot of a worker that already answered the version's prompts
        per worker (late groups have their own bound: _judgeable)."""
        taken = self._taken(group)
        return group.slot().key() not in taken and len(taken) >= self.specs[group.policy_version].prompts_per_worker

    def _note_answer(self, group: RolloutGroup) -> None:
        """Record the group's slot among its worker's answers to its version, refused or not (answered_in_full),
        but never past the prompts per worker: a refused worker's flood must not grow the table either."""
        taken = self.answers.setdefault(group.policy_version, {}).setdefault(group.worker, set())
        if len(taken) < self.specs[group.policy_version].prompts_per_worker:
            taken.add(group.slot().key())

    def _judgeable(self, group: RolloutGroup) -> bool:
        """A late rollout inside the judging window and within its bounds (JUDGED_BEHIND): the worker's slots of
        the version, answered in time or judged late, stay within its prompts per worker."""
        spec = self.specs.get(group.policy_version)
        if spec is None or len(self.judged_only) >= MAX_JUDGED_ONLY:
            return False
        key = (group.policy_version, group.worker)
        if len(self._taken(group)) + self.late_slots.get(key, 0) >= spec.prompts_per_worker:
            return False
        self.late_slots[key] = self.late_slots.get(key, 0) + 1
        return True

    def _judging_floor(self) -> int:
        return self.newest - self.async_level - JUDGED_BEHIND

    def answered_in_full(self, version: int, workers: set[str]) -> bool:
        """Whether each of `workers` sent all its groups for `version` (the spec's prompts per worker): then that
        version brings nothing more, and waiting for it to go quiet only stalls the trainer."""
        workers = {w for w in workers if not self.is_banned(w)}  # all banned: never answered in full
        spec, answers = self.specs.get(version), self.answers.get(version, {})
        return bool(workers) and spec is not None and all(
            len(answers.get(worker, ())) >= spec.prompts_per_worker for worker in workers)

    def on_vote(self, vote: Vote, now: float) -> str:
        if self.validator_banned(vote.validator):
            self.count("vote:validator banned")
            return "validator banned"
        if vote.validator not in self._validators():
            # any key could sign votes for rollouts not seen yet, and their flood evicted the honest early votes
            # from the tracker's bounded buffer, so accepted rollouts timed out
            self.count("vote:not a validator of the run")
            return "not a validator"
        status, settlement = self.tracker.on_vote(vote, now)
        self.count(f"vote:{status}")
        if status in ("counted", "early"):  # signed, and (once its rollout opens) by an assigned validator
            self.evidence.on_vote(vote)
        if settlement is not None:
            self._settle(settlement)
        return status

    def _validators(self) -> set[bytes]:
        """The keys any version inside the window names as its validators."""
        return {key for spec in self.specs.values() for key in spec.validator_keys()}

    def tick(self, now: float) -> None:
        for s in self.tracker.tick(now):
            self._settle(s)

    def forget_old(self, now: float) -> None:
        """Forget what no longer decides anything: slots, answers and specs of versions behind the judging window
        (their rollouts are refused as too stale before a slot check could matter) and settlements older than two
        quorum timeouts (they only answer late duplicate votes). Why: each grows by every rollout, which over a
        run of days is memory without bound."""
        floor = self._judging_floor()
        if floor != self._pruned_below:  # slots and specs only age out when a new version moves the window
            self.slots.forget_below(floor)
            for version in [v for v in self.specs if v < floor]:
                del self.specs[version]
            self.answers = {v: by_worker for v, by_worker in self.answers.items() if v >= floor}
            self.late_slots = {key: n for key, n in self.late_slots.items() if key[0] >= floor}
            self._pruned_below = floor
        self.tracker.forget_settled(now - 2 * self.timeout_s)

    def on_validators(self, present: set[bytes], now: float) -> None:
        """The validators heard from now: rollouts only departed ones could settle time out at once (see
        QuorumTracker.validator_gone); one heard from again owes its votes once more. A banned validator counts
        as departed: its votes are refused, so rollouts that need them could never settle."""
        present = {key for key in present if not self.validator_banned(key)}
        for key in self.present - present:
            for s in self.tracker.validator_gone(key, now):
                self._settle(s)
        for key in present - self.present:
            self.tracker.validator_back(key)
        self.present = present

    def _settle(self, settlement: Settlement) -> None:

        group = self.pending.pop(settlement.rollout_id, None)
        if group is None:
            return
        self.reputation.settle(settlement, group.worker)
        self.count(settlement.outcome.value)
        disputed = self._weigh_near_ties(settlement, group)
        if self.is_banned(group.worker):
            self.probation.forget(group.worker)
        elif settlement.outcome is Outcome.ACCEPTED and not disputed:
            self.probation.on_accepted(group.worker)
        if settlement.rollout_id in self.judged_only:
            self.judged_only.discard(settlement.rollout_id)
        elif settlement.outcome is Outcome.ACCEPTED:
            if self.evidence.is_banned(group.worker):
                self.count(f"refused:{NEAR_TIES}")
            elif disputed:
                self.count(f"refused:{DISPUTED}")
            else:
                self.accepted.append(group)

    def _weigh_near_ties(self, settlement: Settlement, group: RolloutGroup) -> bool:
        """Add the settled group's near-ties to its worker's history; a worker this bans loses its accepted groups
        not yet trained on (they are refused with `near_ties`) and is reported once (take_new_bans). Returns
        whether the group's evidence rows are disputed (swarm.roles.gate_evidence.combine_rows)."""
        spec = self.specs.get(group.policy_version)
        if spec is None:  # its version left the window: no precision to judge it by, and nothing to train
            return False
        judgement, disputed = self.evidence.on_settled(settlement, group.worker, spec.precision)
        if judgement is None or not judgement.newly_banned:
            return disputed
        self.new_bans.append((group.worker, judgement.reason))
        kept = [g for g in self.accepted if g.worker != group.worker]
        if len(kept) < len(self.accepted):
            self.count(f"refused:{NEAR_TIES}", len(self.accepted) - len(kept))
        self.accepted = kept
        return disputed

    def expire(self) -> int:
        """Drop accepted groups the newest version has left behind; returns how many of the in-window groups a
        batch may take now (all of them, less the unproven ones beyond the share: swarm.roles.gate_probation).

        Why: a group is in the async window when its quorum opens, but it may wait in `accepted` while the trainer
        publishes newer versions. The training run refuses such a group (trainer.admission), so handing it out
        would waste a step; in the simulation every batch from the fourth step on consisted of such groups.
        """
        floor = self.newest - self.async_level
        kept = [g for g in self.accepted if g.policy_version >= floor]
        if len(kept) < len(self.accepted):
            self.count("expired", len(self.accepted) - len(kept))
        self.accepted = kept
        return self.probation.trainable(kept, self._proven_active())

    def _proven_active(self) -> bool:
        """Whether a proven worker answered a version the gate still judges (the async window and JUDGED_BEHIND
        more): then unproven workers fill only their share of a batch. Why wider than the async window: right
        after a version goes out no one has answered it, and in a synchronous run a crowd answering first would
        otherwise find no proven worker active and fill the batch. No identity can make a proven worker inactive."""
        return any(self.probation.is_proven(worker) and not self.is_banned(worker)
                   for by_worker in self.answers.values() for worker in by_worker)

    def take(self, n: int) -> list[RolloutGroup]:
        """The `n` freshest accepted groups inside the async window (arrival order among equals), unproven workers'
        within their share (swarm.roles.gate_probation).

        Why freshest first: workers together answer more prompts per version than one step consumes, so a
        first-in-first-out queue grows by the difference every step and its head ages past the async window;
        the freshest groups are the most on-policy ones, and the leftovers expire instead of piling up.
        """
        self.expire()
        ranked = sorted(self.accepted, key=lambda g: -g.policy_version)  # stable: arrival order among equals
        batch, self.accepted = self.probation.batch(ranked, n, self._proven_active())
        return batch
