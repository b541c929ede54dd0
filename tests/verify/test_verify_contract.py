"""The signed run is the contract: a group made by the real generator with one generation setting changed is refused
by the check named after that setting, whatever the group says about itself."""

from __future__ import annotations

import dataclasses

import pytest

from tasks.assignment import assign_tasks
from verify.checks import CheckConfig, RunContext
from verify.rewards import compute_reward
from verify.rollout import Completion, RolloutGroup, RolloutSchemaError
from verify.sampling import SamplingKey
from verify.testing import EOS_ID, GymTasks, generate_group, tiny_model
from verify.verifier import verify_groups

pytestmark = pytest.mark.usefixtures("one_torch_thread")

VERSION = 4
MANIFESTS = {v: bytes([v + 1]) * 32 for v in range(6)}
CONFIG = CheckConfig(min_eos_prob=0.0)  # as validators run (swarm.roles.validator.check_config)


@pytest.fixture(scope="module")
def ctx() -> RunContext:
    return RunContext(run="run-c", current_version=VERSION, async_window=2, manifest_ids=MANIFESTS, max_new_tokens=24,
                      dataset="basic_arithmetic", eligible=list(range(16)), prompts_per_step=2, eos_ids=(EOS_ID,),
                      tasks=GymTasks(size=16), temperature=0.8, group_size=2)


@pytest.fixture(scope="module")
def model():
    return tiny_model(0, eos_boost=2.0)  # EOS is sampled now and then, so the stop tokens matter


def generated(model, ctx: RunContext, *, worker: str = "w1", step: int = 0, pick: int = 0, **changes) -> RolloutGroup:
    """A group the reference generator really made, with the settings of `ctx` except `changes` (temperature,
    group_size, max_new_tokens, eos_ids, prompt), each labelled truthfully where the group carries it."""
    index = assign_tasks(ctx.run, worker, step, ctx.eligible, ctx.prompts_per_step)[pick]
    prompt = list(changes.get("prompt", ctx.tasks.prompt_tokens(ctx.dataset, index)))
    temperature = changes.get("temperature", ctx.temperature)
    limit = changes.get("max_new_tokens", ctx.max_new_tokens)
    keys = [SamplingKey(ctx.run, worker, step, index, i) for i in range(changes.get("group_size", ctx.group_size))]
    entry = ctx.tasks.entry(ctx.dataset, index)
    completions = tuple(
        Completion(g.tokens, g.logprobs, g.finish_reason,
                   compute_reward(entry["reward_fn"], ctx.tasks.decode(g.tokens), entry), g.proof)
        for g in generate_group(model, prompt, keys, temperature, limit, changes.get("eos_ids", ctx.eos_ids)))
    return RolloutGroup(run=ctx.run, policy_version=VERSION, manifest_id=MANIFESTS[VERSION], worker=worker, step=step,
                        dataset=ctx.dataset, task_index=index, prompt_tokens=tuple(prompt), temperature=temperature,
                        max_new_tokens=limit, completions=completions)


def failed(model, ctx, group) -> list[str]:
    verdict = verify_groups({VERSION: model}, [group], ctx, CONFIG)[0]
    return [c.name for c in verdict.checks if not c.ok]


def test_honest_groups_of_the_run_settings_pass(model, ctx):
    groups = [generated(model, ctx, worker=f"w{i}", step=i) for i in range(4)]
    assert any(c.finish_reason == "eos" for g in groups for c in g.completions)  # the stop tokens are exercised
    assert all(v.accepted for v in verify_groups({VERSION: model}, groups, ctx, CONFIG))


def test_another_temperature_honestly_labelled_is_refused_by_temperature(model, ctx):
    assert failed(model, ctx, generated(model, ctx, temperature=1.2)) == ["temperature"]


def test_greedy_decoding_sent_n_times_is_refused_whatever_its_label(model, ctx):
    greedy = generated(model, ctx, temperature=0.0, group_size=1)
    copies = dataclasses.replace(greedy, completions=greedy.completions * ctx.group_size)
    assert failed(model, ctx, copies) == ["temperature"]
    relabelled = dataclasses.replace(copies, temperature=ctx.temperature)
    assert "sampling" in failed(model, ctx, relabelled)


@pytest.mark.parametrize("group_size", [1, 3])
def test_fewer_or_more_completions_than_the_run_asks_for_are_refused_by_group_size(model, ctx, group_size):
    assert failed(model, ctx, generated(model, ctx, group_size=group_size)) == ["group_size"]


def test_a_longer_generation_limit_is_refused_by_max_new_tokens_labelled_or_not(model, ctx):
    assert failed(model, ctx, generated(model, ctx, max_new_tokens=40)) == ["max_new_tokens"]
    rarely_stops = tiny_model(0)  # its completions run to the limit
    longer = generated(rarely_stops, ctx, max_new_tokens=40)
    assert max(len(c.tokens) for c in longer.completions) > ctx.max_new_tokens
    relabelled = dataclasses.replace(longer, max_new_tokens=ctx.max_new_tokens)
    assert "max_new_tokens" in failed(rarely_stops, ctx, relabelled)


def test_generation_past_the_stop_token_is_refused_by_stop_tokens(model, ctx):
    groups = [generated(model, ctx, step=step, eos_ids=()) for step in range(4)]
    unstopped = [g for g in groups if any(EOS_ID in c.tokens[:-1] for c in g.completions)]
    assert unstopped and all("stop_tokens" in failed(model, ctx, g) for g in unstopped)


def test_a_prompt_rendered_otherwise_is_refused_by_rendering(model, ctx):
    index = assign_tasks(ctx.run, "w1", 0, ctx.eligible, ctx.prompts_per_step)[0]
    without_bos = list(ctx.tasks.prompt_tokens(ctx.dataset, index))[1:]
    assert failed(model, ctx, generated(model, ctx, prompt=without_bos)) == ["rendering"]


def test_a_sampling_parameter_the_run_does_not_have_is_a_schema_error(model, ctx):
    wire = generated(model, ctx).to_wire()
    for extra in (dict(wire, top_p=0.9), dict(wire, completions=[dict(wire["completions"][0], seed=3)])):
        with pytest.raises(RolloutSchemaError, match="field the schema does not have"):
            RolloutGroup.from_wire(extra)
    assert failed(model, ctx, dict(wire, top_p=0.9)) == ["schema"]
