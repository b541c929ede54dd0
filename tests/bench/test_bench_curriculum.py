"""`swarm bench curriculum`: reaching a target, bootstrap intervals, per-arm summaries and one small real run."""

import json

import pytest

from swarm.bench.curriculum_stats import bootstrap_mean, paired_difference, reach, summarize_arm
from swarm.cli.main import main


def test_the_target_is_reached_when_the_window_mean_first_gets_there():
    rewards = [0.0, 0.5, 0.0, 0.3, 0.4, 0.4]
    tokens = [10, 10, 20, 20, 20, 20]
    got = reach(rewards, tokens, target=0.3, window=2)
    # the 0.5 of step 2 averages 0.25 with either neighbour; steps 4 and 5 average 0.35
    assert (got.reached, got.steps, got.tokens) == (True, 5, 80)


def test_a_run_that_never_reaches_the_target_counts_all_it_spent():
    got = reach([0.1, 0.2, 0.2], [5, 5, 5], target=0.9, window=1)
    assert (got.reached, got.steps, got.tokens) == (False, 3, 15)


def test_one_lucky_step_inside_a_short_run_is_not_reaching():
    got = reach([0.9], [5], target=0.5, window=3)
    assert not got.reached


def test_reach_rejects_mismatched_inputs():
    with pytest.raises(ValueError):
        reach([0.1, 0.2], [1], target=0.5, window=1)
    with pytest.raises(ValueError):
        reach([0.1], [1], target=0.5, window=0)


def test_the_bootstrap_interval_holds_the_mean_and_is_seeded():
    values = [0.1, 0.2, 0.2, 0.3, 0.25, 0.0, 0.15, 0.2]
    first, again = bootstrap_mean(values), bootstrap_mean(values)
    assert first == again
    assert first.low <= first.mean <= first.high
    assert 0.0 <= first.low and first.high <= 0.3
    assert first.mean == pytest.approx(sum(values) / len(values))
    flat = bootstrap_mean([0.5] * 8)
    assert (flat.low, flat.high) == (0.5, 0.5)


def test_a_wider_spread_gives_a_wider_interval():
    narrow = bootstrap_mean([0.4, 0.5, 0.6] * 3)
    wide = bootstrap_mean([0.0, 0.5, 1.0] * 3)
    assert wide.high - wide.low > narrow.high - narrow.low


def _run(seed, heldout, rewards):
    return {"seed": seed, "rewards": rewards, "tokens": [100] * len(rewards), "heldout_after": heldout,
            "final_reward": rewards[-1]}


def test_an_arm_summary_counts_runs_that_reach_and_averages_the_rest():
    runs = [_run(0, 0.2, [0.0, 0.3, 0.3]), _run(1, 0.1, [0.0, 0.0, 0.0])]
    summary = summarize_arm(runs, target=0.3, window=2)
    assert summary["reached_target"] == 1 and summary["seeds"] == 2
    assert summary["steps_to_target"]["mean"] == 3.0  # 3 steps to reach; 3 spent without reaching
    assert summary["heldout_accuracy"]["mean"] == pytest.approx(0.15)


def test_the_paired_difference_matches_seeds():
    first = [_run(0, 0.3, [0.1]), _run(1, 0.5, [0.1])]
    second = [_run(1, 0.1, [0.1]), _run(0, 0.2, [0.1])]
    diff = paired_difference(first, second, "heldout_after")
    assert diff["mean"] == pytest.approx(((0.3 - 0.2) + (0.5 - 0.1)) / 2, abs=1e-4) and diff["n"] == 2


def test_a_bad_task_config_is_one_sentence(capsys):
    assert main(["bench", "curriculum", "--task-config", "max_value = "]) == 2
    err = capsys.readouterr().err
    assert "--task-config" in err and "Traceback" not in err and err.count("\n") == 1


def test_a_small_real_benchmark_reports_both_arms(capsys):
    """Four fixed-context steps of tokens per arm on the tiny model: each arm trains, keeps to its budget,
    evaluates."""
    assert main(["bench", "curriculum", "--json", "--seeds", "1", "--token-budget", "256", "--eval-n", "4",
                 "--group-size", "4", "--prompts-per-step", "2"]) == 0
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert set(report["arms"]) == {"fastcurl", "none"}
    for arm, runs in report["runs"].items():
        (only,) = runs
        assert 1 <= len(only["rewards"]) == len(only["tokens"]) and sum(only["tokens"]) <= 256
        assert 0.0 <= only["heldout_after"] <= 1.0
    assert len(report["runs"]["none"][0]["rewards"]) == 4  # 256 / (2 prompts x 4 completions x 8 tokens)
    assert "heldout_after" in report["fastcurl_minus_none"]
