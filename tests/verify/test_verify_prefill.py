"""The verifier's prefill: completions run in passes of similar lengths over their prompts' shared cache, and the
hidden states and logits equal a plain forward of each prompt + completion alone."""

from __future__ import annotations

import itertools
import random

import pytest
import torch

import verify.verifier as verifier
from verify.model_inputs import length_buckets
from verify.rollout import Completion, RolloutGroup
from verify.testing import tiny_model

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def padded_cost(lengths: list[int], buckets: list[list[int]], pass_cost: int) -> int:
    return sum(len(b) * max(lengths[r] for r in b) + pass_cost for b in buckets)


def cheapest_split(lengths: list[int], pass_cost: int) -> int:
    """Brute force over every split of the sorted rows into contiguous runs (2^(n-1) of them)."""
    ordered = sorted(lengths)
    best = None
    for cuts in itertools.product([False, True], repeat=len(ordered) - 1):
        runs, run = [], [ordered[0]]
        for cut, size in zip(cuts, ordered[1:]):
            if cut:
                runs.append(run)
                run = []
            run.append(size)
        runs.append(run)
        cost = sum(len(r) * max(r) + pass_cost for r in runs)
        best = cost if best is None else min(best, cost)
    return best


@pytest.mark.parametrize("seed", range(40))
def test_buckets_are_the_cheapest_split_and_cover_every_row_once(seed):
    rng = random.Random(seed)
    lengths = [rng.choice([rng.randint(0, 8), rng.randint(0, 64)]) for _ in range(rng.randint(1, 9))]
    pass_cost = rng.choice([0, 1, 8, 32, 1000])
    buckets = length_buckets(lengths, pass_cost)
    assert sorted(r for b in buckets for r in b) == list(range(len(lengths)))
    assert all(b == sorted(b) for b in buckets)
    assert padded_cost(lengths, buckets, pass_cost) == cheapest_split(lengths, pass_cost)


def test_one_pass_when_passes_are_dear_and_no_padding_when_free():
    lengths = [3, 64, 7, 64, 20, 1]
    assert length_buckets(lengths, 10**9) == [list(range(6))]
    free = length_buckets(lengths, 0)
    assert all(len({lengths[r] for r in b}) == 1 for b in free)
    assert length_buckets([], 5) == []


def pending(index: int, prompt: list[int], completions: list[list[int]]) -> verifier._Pending:
    group = RolloutGroup(
        run="r", policy_version=0, manifest_id=b"\0" * 32, worker="w", step=index, dataset="d", task_index=index,
        prompt_tokens=tuple(prompt), temperature=1.0, max_new_tokens=64,
        completions=tuple(Completion(tuple(c), tuple([0.0] * len(c)), "length", 0.0, b"") for c in completions))
    return verifier._Pending(index, group, [], [None] * len(completions))


@pytest.mark.parametrize("pass_cost", [0, 4, 10**9])
def test_bucketed_prefill_equals_each_sequence_alone(monkeypatch, pass_cost):
    model = tiny_model(0)
    rng = random.Random(1)
    batch = [pending(i, [rng.randrange(3, 500) for _ in range(rng.randint(2, 12))],
                     [[rng.randrange(3, 500) for _ in range(n)] for n in sizes])
             for i, sizes in enumerate([[1, 9, 30, 2], [17, 17], [5, 40, 1]])]
    monkeypatch.setattr(verifier, "PASS_COST_TOKENS", {"cpu": pass_cost})
    logits = verifier._prefill_batch(model, batch)
    with torch.no_grad():
        for item, item_logits in zip(batch, logits):
            prompt = list(item.group.prompt_tokens)
            for j, completion in enumerate(item.group.completions):
                ids = torch.tensor([prompt + list(completion.tokens[:-1])])
                alone = model.model(input_ids=ids).last_hidden_state[0, len(prompt) - 1:]
                assert item.hidden[j].shape == alone.shape
                torch.testing.assert_close(item.hidden[j], alone, atol=1e-4, rtol=1e-4)
                torch.testing.assert_close(item_logits[j], model.lm_head(alone), atol=1e-4, rtol=1e-4)
