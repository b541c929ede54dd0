"""The vote quorum as a pure state machine: events in (rollout opened, vote received, time passed), decisions out.

Why sans-IO: the same object decides in the trainer, in validators and in the in-memory simulation, and its timing
is tested on virtual time; `now` is always passed in (trio.current_time() in the IO adapter), never read here.

Rules, for a rollout assigned to r validators (verify.votes.assign_validators, by its slot) and quorum q:
  - ACCEPTED as soon as q assigned validators voted accept;
  - REJECTED as soon as a majority of the r (more than r/2) voted reject, or when rejecting votes put q out of
    reach;
  - TIMED_OUT when neither happened within `timeout_s` of opening (the trainer does not train on it), or at once
    when q is out of reach for want of validators: fewer than q assigned, or assigned ones that left the swarm
    (`validator_gone`) still owe the votes it needs. Timeouts blame nobody;
  - a vote that is forged, from a validator not assigned to the rollout, a duplicate, for a settled rollout or
    for an unknown one is ignored with a reason; votes that arrive before their rollout is opened are held in a
    bounded buffer and replayed at open (gossip does not order rollouts before votes).
"""

from __future__ import annotations

import enum
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field

from verify.votes import Vote, assign_validators, verify_vote


class Outcome(enum.Enum):
    PENDING = "pending"
    ACCEPTED = "accepted"
    REJECTED = "rejected"
    TIMED_OUT = "timed_out"


@dataclass(frozen=True)
class QuorumConfig:
    """replicas: validators assigned per rollout (r); quorum: accepting votes needed (q <= r);
    timeout_s: virtual seconds a rollout may wait for its votes; max_early_votes: buffer bound for votes that
    precede their rollout."""

    replicas: int = 3
    quorum: int = 2
    timeout_s: float = 120.0
    max_early_votes: int = 10_000

    def __post_init__(self) -> None:
        if not 1 <= self.quorum <= self.replicas:
            raise ValueError("quorum must be between 1 and replicas")


@dataclass(frozen=True)
class Settlement:
    """A settled rollout: its outcome, when, and who voted what (validator key -> accept)."""

    rollout_id: bytes
    outcome: Outcome
    at: float
    votes: dict[bytes, bool] = field(default_factory=dict)


@dataclass
class _Open:
    assigned: tuple[bytes, ...]
    deadline: float
    votes: dict[bytes, bool] = field(default_factory=dict)


class QuorumTracker:
    """Tracks every open rollout's votes and settles it; all methods are pure functions of their inputs + state."""

    def __init__(self, config: QuorumConfig | None = None) -> None:
        self.config = config or QuorumConfig()
        self._open: dict[bytes, _Open] = {}
        self._settled: dict[bytes, Settlement] = {}
        self._early: OrderedDict[tuple[bytes, bytes], Vote] = OrderedDict()
        self._gone: set[bytes] = set()  # validators that left: the votes they owe will not come

    def open(self, rollout_id: bytes, slot_key: bytes, validators: Sequence[bytes],
             now: float) -> tuple[tuple[bytes, ...], list[Settlement]]:
        """Start tracking a rollout; returns its assigned validators and any settlement the buffered votes cause.

        Votes name the rollout id (what a validator checked), but the validators are drawn by `slot_key`
        (verify.rollout.Slot.key), so a worker cannot pick them by choosing its bytes."""
        if rollout_id in self._open or rollout_id in self._settled:
            return self.assigned(rollout_id), []
        assigned = assign_validators(slot_key, validators, self.config.replicas)
        state = self._open[rollout_id] = _Open(assigned, now + self.config.timeout_s)
        settled = []
        for key in [k for k in self._early if k[0] == rollout_id]:
            _, s = self.on_vote(self._early.pop(key), now)
            settled.extend([s] if s else [])
        if rollout_id in self._open and (s := self._decide(rollout_id, state, now)) is not None:
            settled.append(s)  # assigned to departed validators: it can never reach the quorum
        return assigned, settled

    def assigned(self, rollout_id: bytes) -> tuple[bytes, ...]:
        state = self._open.get(rollout_id)
        return state.assigned if state else ()

    def on_vote(self, vote: Vote, now: float) -> tuple[str, Settlement | None]:
        """Apply one vote. Returns ('counted' or why it was ignored, the settlement it caused or None)."""
        if not verify_vote(vote):
            return "forged", None
        if vote.rollout_id in self._settled:
            return "settled", None
        state = self._open.get(vote.rollout_id)
        if state is None:
            if len(self._early) >= self.config.max_early_votes:
                self._early.popitem(last=False)
            self._early[(vote.rollout_id, vote.validator)] = vote
            return "early", None
        if vote.validator not in state.assigned:
            return "unassigned", None
        if vote.validator in state.votes:
            return "duplicate", None
        state.votes[vote.validator] = vote.accept
        return "counted", self._decide(vote.rollout_id, state, now)

    def tick(self, now: float) -> list[Settlement]:
        """Time out every open rollout whose deadline has passed."""
        expired = [rid for rid, s in self._open.items() if now >= s.deadline]
        return [self._settle(rid, Outcome.TIMED_OUT, now) for rid in expired]

    def validator_gone(self, validator: bytes, now: float) -> list[Settlement]:
        """A validator left the swarm: time out at once every open rollout (and every one opened later) that cannot
        be accepted without the votes it and other departed validators still owe; timeouts blame nobody.

        Why not wait for the deadline: nothing can settle those rollouts any more, and the trainer waited the
        whole quorum timeout (120 s) for them before it could publish a version naming the validators still here.
        """
        self._gone.add(validator)
        stuck = [(rid, s) for rid, s in self._open.items() if validator in s.assigned]
        return [x for rid, s in stuck if (x := self._decide(rid, s, now)) is not None]

    def validator_back(self, validator: bytes) -> None:
        """A departed validator is heard from again: its votes count as owed once more."""
        self._gone.discard(validator)

    def outcome(self, rollout_id: bytes) -> Outcome | None:
        """The outcome of a known rollout (PENDING while open), None for an unknown one."""
        if rollout_id in self._settled:
            return self._settled[rollout_id].outcome
        return Outcome.PENDING if rollout_id in self._open else None

    def forget_settled(self, before: float) -> int:
        """Drop settlements older than `before` (they only answer duplicate votes); returns how many."""
        old = [rid for rid, s in self._settled.items() if s.at < before]
        for rid in old:
            del self._settled[rid]
        return len(old)

    def next_deadline(self) -> float | None:
        """When the adapter should call tick() next (None when nothing is open)."""
        return min((s.deadline for s in self._open.values()), default=None)

    def _decide(self, rollout_id: bytes, state: _Open, now: float) -> Settlement | None:
        accepts = sum(state.votes.values())
        rejects = len(state.votes) - accepts
        owed = [v for v in state.assigned if v not in state.votes]
        if accepts >= self.config.quorum:
            return self._settle(rollout_id, Outcome.ACCEPTED, now)
        enough_assigned = len(state.assigned) >= self.config.quorum
        if rejects * 2 > self.config.replicas or (enough_assigned and accepts + len(owed) < self.config.quorum):
            return self._settle(rollout_id, Outcome.REJECTED, now)
        if accepts + sum(v not in self._gone for v in owed) < self.config.quorum:
            # out of reach for want of validators (too few assigned, or gone), not by votes: nobody is blamed
            return self._settle(rollout_id, Outcome.TIMED_OUT, now)
        return None

    def _settle(self, rollout_id: bytes, outcome: Outcome, now: float) -> Settlement:
        state = self._open.pop(rollout_id)
        settlement = Settlement(rollout_id, outcome, now, dict(state.votes))
        self._settled[rollout_id] = settlement
        return settlement
