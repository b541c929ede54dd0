"""One slot, one rollout: the ledger validators and the gate keep, on near-duplicates of a real group."""

from __future__ import annotations

import dataclasses

import pytest

from verify.checks import RunContext
from verify.slots import ECHO, NEW, RESUBMITTED, SlotLedger, first_answers
from verify.testing import GymTasks, honest_group, tiny_model

pytestmark = pytest.mark.usefixtures("one_torch_thread")

VERSION = 3


@pytest.fixture(scope="module")
def groups():
    ctx = RunContext(run="run-s", current_version=VERSION, async_window=2, manifest_ids={VERSION: bytes(32)},
                     max_new_tokens=12, dataset="basic_arithmetic", eligible=list(range(16)), prompts_per_step=2,
                     eos_ids=(), tasks=GymTasks(size=16), temperature=0.8, group_size=3)
    model = tiny_model(0)
    return [honest_group(model, ctx, worker="w1", step=VERSION, version=VERSION, group_size=3, temperature=0.8,
                         pick=pick) for pick in range(2)]


def near_duplicates(group):
    first, *rest = group.completions
    jittered = dataclasses.replace(first, logprobs=(first.logprobs[0] - 0.005,) + first.logprobs[1:])
    return {"jittered logprob": dataclasses.replace(group, completions=(jittered, *rest)),
            "subset": dataclasses.replace(group, completions=(first, rest[0])),
            "reordered": dataclasses.replace(group, completions=(*rest, first))}


def test_the_ledger_tells_echoes_from_resubmissions_and_forgets_behind_the_window(groups):
    ledger = SlotLedger()
    first, other = groups
    assert ledger.classify(first) == NEW
    ledger.record(first)
    assert ledger.classify(first) == ECHO and ledger.classify(other) == NEW
    for name, copy in near_duplicates(first).items():
        assert ledger.classify(copy) == RESUBMITTED, name
    ledger.record(other)
    assert ledger.forget_below(VERSION) == 0 and ledger.forget_below(VERSION + 1) == 2 and len(ledger) == 0


def test_a_validator_checks_only_the_first_group_of_a_slot_and_refuses_the_others_unprefilled(groups):
    ledger = SlotLedger()
    first, other = groups
    copies = list(near_duplicates(first).values())
    fresh, refused = first_answers(ledger, [first, copies[0], other, first])
    assert fresh == [first, other, first]  # an echo of the same bytes is checked as before
    assert [v.rollout_id for v in refused] == [copies[0].rollout_id()]
    assert refused[0].reason.startswith("slot: w1 already sent another group")
    fresh, refused = first_answers(ledger, copies[1:])  # in a later batch too
    assert fresh == [] and len(refused) == 2 and not any(v.accepted for v in refused)
