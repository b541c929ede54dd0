"""Rollout checks on hand-built honest and dishonest groups, and the batched verifier on real tiny-model generation."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from tasks.assignment import assign_tasks
from verify import toploc
from verify.checks import (
    CheckConfig,
    RunContext,
    check_contract,
    check_lengths,
    check_policy,
    check_stop_tokens,
    check_termination,
)
from verify.rollout import Completion, RolloutGroup
from verify.testing import EOS_ID, GymTasks, honest_group, tiny_model
from verify.verifier import verify_groups

pytestmark = pytest.mark.usefixtures("one_torch_thread")

VERSION = 5
MANIFESTS = {v: bytes([v]) * 32 for v in range(8)}


@pytest.fixture(scope="module")
def ctx() -> RunContext:
    return RunContext(run="run-a", current_version=VERSION, async_window=2, manifest_ids=MANIFESTS, max_new_tokens=36,
                      dataset="basic_arithmetic", eligible=list(range(16)), prompts_per_step=2, eos_ids=(),
                      tasks=GymTasks(size=16), temperature=0.8, group_size=2)


@pytest.fixture(scope="module")
def model():
    return tiny_model(0)


@pytest.fixture(scope="module")
def honest(model, ctx) -> list[RolloutGroup]:
    return [honest_group(model, ctx, worker=f"w{i}", step=i, version=VERSION, group_size=2, temperature=0.8, pick=i % 2)
            for i in range(3)]


def names_failed(verdict) -> list[str]:
    return [c.name for c in verdict.checks if not c.ok]


def test_honest_groups_pass_whatever_the_batch_composition(model, ctx, honest):
    together = verify_groups({VERSION: model}, honest, ctx)
    alone = [verify_groups({VERSION: model}, [g], ctx)[0] for g in honest]
    tiny_batches = verify_groups({VERSION: model}, list(reversed(honest)), ctx, max_batch_tokens=64)
    for verdict in together + alone + tiny_batches:
        assert verdict.accepted, verdict.reason
        assert [c.name for c in verdict.checks] == [
            "schema", "policy", "temperature", "group_size", "max_new_tokens", "assignment", "rendering", "length",
            "stop_tokens", "termination", "sampling", "logprobs", "reward", "toploc"]
    assert [v.rollout_id for v in together] == [g.rollout_id() for g in honest]


def replace_completion(group: RolloutGroup, **changes) -> RolloutGroup:
    first = dataclasses.replace(group.completions[0], **changes)
    return dataclasses.replace(group, completions=(first,) + group.completions[1:])


def dishonest_variants(group: RolloutGroup, ctx: RunContext) -> dict[str, tuple[RolloutGroup, str]]:
    """Each tampering and the check that must catch it."""
    c0 = group.completions[0]
    swapped = list(c0.tokens)
    swapped[3] = (swapped[3] + 1) % 256 + 3
    unassigned = next(
        i for i in ctx.eligible if i not in assign_tasks(ctx.run, group.worker, group.step, ctx.eligible, 2)
    )
    return {
        "stale version": (
            dataclasses.replace(group, policy_version=VERSION - 3, manifest_id=MANIFESTS[VERSION - 3]),
            "policy",
        ),
        "wrong manifest": (dataclasses.replace(group, manifest_id=MANIFESTS[VERSION - 1]), "policy"),
        "other run": (dataclasses.replace(group, run="run-b"), "policy"),
        "unassigned prompt": (
            dataclasses.replace(
                group, task_index=unassigned, prompt_tokens=tuple(ctx.tasks.prompt_tokens(ctx.dataset, unassigned))
            ),
            "assignment",
        ),
        "edited prompt": (dataclasses.replace(group, prompt_tokens=group.prompt_tokens[:-1] + (40,)), "rendering"),
        "longer limit": (dataclasses.replace(group, max_new_tokens=ctx.max_new_tokens + 1), "max_new_tokens"),
        "token outside vocab": (replace_completion(group, tokens=c0.tokens[:-1] + (100_000,)), "length"),
        "swapped token": (replace_completion(group, tokens=tuple(swapped)), "sampling"),
        "other temperature claimed": (dataclasses.replace(group, temperature=1.3), "temperature"),
        "a completion dropped": (dataclasses.replace(group, completions=group.completions[:1]), "group_size"),
        "truncated": (replace_completion(group, tokens=c0.tokens[:-4], logprobs=c0.logprobs[:-4]), "termination"),
        "edited logprob": (replace_completion(group, logprobs=(c0.logprobs[0] - 0.1,) + c0.logprobs[1:]), "logprobs"),
        "fabricated reward": (replace_completion(group, reward=1.0 - c0.reward), "reward"),
        "proof of another completion": (replace_completion(group, proof=group.completions[1].proof), "toploc"),
        "garbled proof": (replace_completion(group, proof=c0.proof[:100] + bytes(158) + c0.proof[258:]), "toploc"),
    }


def test_each_tampering_is_rejected_by_the_check_that_owns_it(model, ctx, honest):
    variants = dishonest_variants(honest[0], ctx)
    verdicts = verify_groups({VERSION: model}, [g for g, _ in variants.values()], ctx)
    for (name, (_, check)), verdict in zip(variants.items(), verdicts):
        assert not verdict.accepted, name
        assert check in names_failed(verdict), (name, verdict.reason)


def test_another_model_of_the_same_shape_is_caught_by_proof_and_sampling(ctx, honest):
    verdict = verify_groups({VERSION: tiny_model(1)}, honest[:1], ctx)[0]
    assert not verdict.accepted and {"sampling", "logprobs", "toploc"} <= set(names_failed(verdict))


def test_hostile_inputs_give_rejecting_verdicts_not_exceptions(model, ctx, honest):
    wire = honest[0].to_wire()
    nan_logprob = dict(
        wire,
        completions=[dict(wire["completions"][0], logprobs=[float("nan")] * len(wire["completions"][0]["tokens"]))],
    )
    inputs = [
        b"\x00garbage",
        {"v": 1},
        None,
        17,
        nan_logprob,
        dict(wire, temperature=float("inf")),
        dict(wire, completions=[dict(wire["completions"][0], reward=7.0)] + wire["completions"][1:]),
    ]
    verdicts = verify_groups({VERSION: model}, inputs, ctx)
    assert len(verdicts) == len(inputs) and not any(v.accepted for v in verdicts)
    assert all(v.reason for v in verdicts)
    assert "reward" in names_failed(verdicts[-1])


def test_unknown_version_is_a_rejection_with_a_reason(ctx, honest):
    verdict = verify_groups({}, honest[:1], ctx)[0]
    assert not verdict.accepted and "does not hold policy version" in verdict.reason


def make_group(tokens, finish, max_new=8) -> RolloutGroup:
    completion = Completion(
        tuple(tokens), tuple([-1.0] * len(tokens)), finish, 0.0, b"\0" * toploc.proof_size(len(tokens))
    )
    return RolloutGroup(
        run="run-a",
        policy_version=VERSION,
        manifest_id=MANIFESTS[VERSION],
        worker="w",
        step=0,
        dataset="basic_arithmetic",
        task_index=0,
        prompt_tokens=(1, 5),
        temperature=1.0,
        max_new_tokens=max_new,
        completions=(completion,),
    )


@pytest.mark.parametrize(
    "tokens,finish,p_last,ok",
    [
        ([5, 6, EOS_ID], "eos", 0.5, True),
        ([5, 6, EOS_ID], "eos", 0.05, False),  # INTELLECT-2: EOS must have had probability > 0.1
        ([5] * 8, "length", 0.0, True),
        ([5] * 7, "length", 0.0, False),  # truncated below the limit
    ],
)
def test_termination_rule(ctx, tokens, finish, p_last, ok):
    eos_ctx = dataclasses.replace(ctx, eos_ids=(EOS_ID,), max_new_tokens=8)
    result = check_termination(make_group(tokens, finish), [p_last], eos_ctx, CheckConfig())
    assert result.ok is ok and result.name == "termination"
    assert bool(result.reason) is not ok


@pytest.mark.parametrize("tokens,finish,ok", [
    ([5, 6, EOS_ID], "eos", True),
    ([5] * 8, "length", True),
    ([5, EOS_ID, 6], "length", False),  # generation continued past the stop token
    ([5, EOS_ID, EOS_ID], "eos", False),
    ([5, 6, 7], "eos", False),  # claims EOS without one
    ([5, 6, EOS_ID], "length", False),  # stopped at EOS but claims the limit
])
def test_stop_token_rule(ctx, tokens, finish, ok):
    result = check_stop_tokens(make_group(tokens, finish), dataclasses.replace(ctx, eos_ids=(EOS_ID,)))
    assert result.ok is ok and result.name == "stop_tokens"
    assert bool(result.reason) is not ok


def test_policy_window_edges(ctx):
    for version, ok in [(VERSION, True), (VERSION - 2, True), (VERSION - 3, False), (VERSION + 1, False)]:
        group = dataclasses.replace(make_group([5], "length"), policy_version=version, manifest_id=MANIFESTS[version])
        assert check_policy(group, ctx).ok is ok


def test_length_limits(ctx):
    def limit_ok(group) -> bool:
        return next(c for c in check_contract(group, ctx) if c.name == "max_new_tokens").ok

    assert limit_ok(make_group([5] * 36, "length", max_new=36))
    assert not limit_ok(make_group([5] * 37, "length", max_new=36))
    assert not limit_ok(make_group([5], "length", max_new=37))
    assert check_lengths(make_group([5] * 36, "length", max_new=36), ctx, 512).ok
    assert not check_lengths(make_group([5, 600], "length", max_new=36), ctx, 512).ok


@pytest.mark.parametrize("vocab", [7, 384, 70_000])
def test_validator_noise_is_bit_identical_to_the_samplers(vocab):
    from verify.sampling import SamplingKey, completion_noise, gumbel_noise, gumbel_noise_batch

    key, other = SamplingKey("run-a", "w3", 9, 4, 1), SamplingKey("run-a", "w3", 9, 4, 2)
    length = 5 if vocab > 1000 else 40
    per_position = torch.stack([gumbel_noise(key, t, vocab) for t in range(length)])
    assert torch.equal(completion_noise(key, length, vocab), per_position)
    mixed = gumbel_noise_batch([other, key, other], [3, length - 1, 0], vocab)  # a decoding batch's row order
    assert torch.equal(mixed[1], per_position[-1])
    assert torch.equal(mixed[0], gumbel_noise(other, 3, vocab)) and torch.equal(mixed[2], gumbel_noise(other, 0, vocab))


@pytest.mark.parametrize("field,bad,needle", [
    ("tokens", [5, True, 7], "not a token id"),  # a bool is not a token, though Python counts it as an int
    ("tokens", [5, -1, 7], "not a token id"),
    ("tokens", [5, 1 << 31, 7], "not a token id"),
    ("tokens", [5, 6.0, 7], "not a token id"),
    ("logprobs", [-0.5, float("nan"), -0.1], "logprob is not finite"),
    ("logprobs", [-0.5, float("-inf"), -0.1], "logprob is not finite"),
    ("logprobs", [-0.5, 0.3, -0.1], "positive logprob 0.3"),
    ("logprobs", [-0.5, "x", -0.1], "logprob must be a number"),
    ("logprobs", [-0.5, False, -0.1], "logprob must be a number"),
])
def test_the_schema_names_a_bad_token_or_logprob(field, bad, needle):
    """Tokens and logprobs are checked by whole-list passes; a failure is still named the way a per-value check
    names it."""
    from verify.rollout import RolloutSchemaError

    wire = make_group([5, 6, 7], "length").to_wire()
    wire["completions"][0][field] = bad
    with pytest.raises(RolloutSchemaError, match=needle):
        RolloutGroup.from_wire(wire)
    wire["completions"][0][field] = [5, 6, 7] if field == "tokens" else [-0.5, 0, -0.1]  # an int 0 is a logprob
    assert RolloutGroup.from_wire(wire).completions[0].logprobs[1] == (0.0 if field == "logprobs" else -1.0)
