"""Planning a curriculum's steps against a budget of generated tokens (trainer.curriculum.steps_within_budget)."""

import pytest

from trainer.curriculum import (
    fastcurl,
    load_curriculum,
    no_curriculum,
    step_token_bound,
    steps_within_budget,
    worst_case_tokens,
)


def test_a_step_costs_its_stages_prompts_times_group_times_context():
    cur = fastcurl(total_steps=4, max_new_tokens=8, group_size=16)  # short@4, all@8, long@12, all@8 with 32
    assert [step_token_bound(cur, s, prompts_per_step=4) for s in range(5)] == [256, 512, 768, 1024, 1024]
    assert worst_case_tokens(cur, 4, prompts_per_step=4) == 256 + 512 + 768 + 1024


def test_the_fixed_context_spends_the_budget_in_equal_steps():
    assert steps_within_budget("none", 8192, max_new_tokens=8, group_size=16, prompts_per_step=4) == 16
    assert steps_within_budget("none", 8191, max_new_tokens=8, group_size=16, prompts_per_step=4) == 15


@pytest.mark.parametrize("budget", [1, 2_000, 8_192, 8_193, 50_000, 123_457])
@pytest.mark.parametrize("spec", ["fastcurl", "none"])
def test_the_planned_schedule_fits_the_budget_and_one_more_step_would_not(spec, budget):
    shape = {"max_new_tokens": 8, "group_size": 16}
    steps = steps_within_budget(spec, budget, prompts_per_step=4, **shape)

    def cost(n: int) -> int:
        return worst_case_tokens(load_curriculum(spec, total_steps=n, **shape), n, 4)

    assert steps >= 1
    assert cost(steps) <= budget or steps == 1
    assert cost(steps + 1) > budget


def test_fastcurl_plans_fewer_steps_than_a_fixed_context_for_the_same_tokens():
    """Its stages average 5/4 of the fixed context's tokens per step (M/2, M, 3M/2 and M with twice the group)."""
    fixed = steps_within_budget("none", 40_960, max_new_tokens=8, group_size=16, prompts_per_step=4)
    curriculum = steps_within_budget("fastcurl", 40_960, max_new_tokens=8, group_size=16, prompts_per_step=4)
    assert (fixed, curriculum) == (80, 64)
    assert worst_case_tokens(fastcurl(64, 8, 16), 64, 4) == worst_case_tokens(no_curriculum(80, 8, 16), 80, 4)
