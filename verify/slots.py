"""One slot, one rollout: the sans-IO ledger of the slots a gate, a validator or the trainer has seen.

Why: a rollout's identity is its slot (verify.rollout.Slot: run, version, worker, assigned task; its completion
indices follow from the run's group size), not its bytes. A worker that sends a second group for a slot it already
answered, with one logprob jittered inside the tolerance, with its completions reordered or with a subset of them,
is replaying one piece of work to multiply its weight in the gradient; keyed by bytes, every copy would look new. The
ledger keeps, per slot, the rollout id (the bytes) first seen for it, so the same bytes again (a gossip echo, an
announced group fetched twice) are told apart from other bytes for the slot (a resubmission, which costs its
worker).

Bounded by the async window: a slot names its policy version, and a group older than `newest - async_level` is
refused as too stale before its slot is looked at, so `forget_below` drops every slot of such versions and the
ledger holds at most the slots of `async_level + 1` versions.
"""

from __future__ import annotations

from verify.rollout import RolloutGroup
from verify.verdicts import CheckResult, Verdict

NEW, ECHO, RESUBMITTED = "new", "echo", "resubmitted"


class SlotLedger:
    """The slots seen, each with its version and the rollout id first seen for it."""

    def __init__(self) -> None:
        self._slots: dict[bytes, tuple[int, bytes]] = {}  # slot key -> (policy version, rollout id)

    def __len__(self) -> int:
        return len(self._slots)

    def __contains__(self, slot_key: bytes) -> bool:
        return slot_key in self._slots

    def versions(self) -> set[int]:
        return {version for version, _ in self._slots.values()}

    def classify(self, group: RolloutGroup, rollout_id: bytes | None = None) -> str:
        """NEW (slot never seen), ECHO (seen with exactly these bytes) or RESUBMITTED (seen with other bytes)."""
        seen = self._slots.get(group.slot().key())
        if seen is None:
            return NEW
        return ECHO if seen[1] == (rollout_id or group.rollout_id()) else RESUBMITTED

    def record(self, group: RolloutGroup, rollout_id: bytes | None = None) -> None:
        """Remember the group's slot (the first bytes for it stay: a later record of the slot changes nothing)."""
        self._slots.setdefault(group.slot().key(), (group.policy_version, rollout_id or group.rollout_id()))

    def forget_below(self, floor: int) -> int:
        """Drop the slots of versions below `floor` (the async window's oldest); returns how many."""
        old = [key for key, (version, _) in self._slots.items() if version < floor]
        for key in old:
            del self._slots[key]
        return len(old)


def first_answers(ledger: SlotLedger, groups: list[RolloutGroup]) -> tuple[list[RolloutGroup], list]:
    """A validator's split of a batch: (groups whose slot is new or whose bytes it checked before, rejecting
    verdicts of the rest). A second group for a slot, whatever its bytes, gets a `slot` verdict without a prefill;
    the first one for a slot is recorded here, so a batch holding two groups of one slot checks only the first."""
    fresh, refused = [], []
    for group in groups:
        rid = group.rollout_id()
        if ledger.classify(group, rid) == RESUBMITTED:
            refused.append(Verdict(rid, False, (CheckResult("slot", False, (
                f"{group.worker} already sent another group for task {group.task_index} of version "
                f"{group.policy_version}")),)))
            continue
        ledger.record(group, rid)
        fresh.append(group)
    return fresh, refused
