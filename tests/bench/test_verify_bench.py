"""`swarm bench verify` end to end at the smallest size: the production torch backend's rollouts pass the
verifier in every batch layout, and every attack that is detectable at this length is rejected."""

from __future__ import annotations

import json

from swarm.cli.main import main


def test_bench_verify_smoke(capsys):
    assert main(["bench", "verify", "--json", "--groups", "2", "--group-size", "2", "--max-new-tokens", "8",
                 "--history", "off"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert "history" not in report
    rows = {r["case"]: r for r in report["cases"]}
    assert report["summary"]["false_rejects"] == 0
    assert all(r["groups"] == 2 for r in rows.values())
    # int8 and 1e-3 noise are statistical at 8 tokens (see the full bench); these are caught by construction
    for name in (
        "other_model_same_shape",
        "sampled_at_other_temperature",
        "older_version_replayed",
        "smaller_model_completion_reproved",
        "unassigned_prompt",
        "4_tokens_replaced_reproved",
        "completion_truncated_reproved",
        "fabricated_reward",
        "weights_perturbed_1e-3_fp32_same_kernels_toploc",
    ):
        assert rows[name]["rejected"] == 2, (name, rows[name])
    assert report["summary"]["proof_bytes_per_32_tokens"] == [258.0]


def test_bench_verify_honest_only_runs_just_the_cost_cases(capsys):
    assert main(["bench", "verify", "--json", "--groups", "2", "--group-size", "2", "--max-new-tokens", "8",
                 "--honest-only"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert {r["kind"] for r in report["cases"]} == {"honest"} and len(report["cases"]) == 4
    assert report["summary"]["false_rejects"] == 0 and report["summary"]["validate_share_of_gen"] > 0


def test_bench_verify_history_section_at_the_smallest_size(capsys):
    """The worker-history section alone: honest workers, every attack class with its attempts, and the cost."""
    assert main(["bench", "verify", "--json", "--groups", "2", "--group-size", "2", "--max-new-tokens", "8",
                 "--history", "only", "--honest-groups", "6", "--per-worker", "3", "--attempts", "3"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["cases"] == []
    history = report["history"]
    honest = history["honest"]
    assert (honest["groups"], honest["workers"], honest["false_rejects"], honest["false_bans"]) == (6, 2, 0, 0)
    assert sum(honest["flips_per_group"].values()) == 6 and honest["tokens"] > 0
    classes = {c["class"]: c for c in history["classes"]}
    assert set(classes) == {"other_temperature_labelled", "other_group_size", "near_duplicate_resubmitted",
                            "int8_decoded_reproved", "near_ties_steered"}
    assert all(c["attempts"] == 3 and c["groups"] >= 3 for c in classes.values())
    assert all(c["groups"] <= 3 * 20 for c in classes.values())
    assert history["cost"]["bytes_per_worker"] > 0 and history["targets_met"]["honest"] is False  # 6 < 2,000


def test_bench_verify_refuses_a_history_count_below_one(capsys):
    assert main(["bench", "verify", "--attempts", "0"]) == 2
    assert "--attempts must be at least 1, got 0" in capsys.readouterr().err


def test_bench_config_defaults_match_the_command_line():
    """A BenchConfig built in code runs the same sizes as a bare `swarm bench verify`."""
    import argparse
    import dataclasses

    from swarm.bench.verify import add_arguments
    from swarm.bench.verify_harness import BenchConfig

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = vars(parser.parse_args([]))
    defaults = {f.name: f.default for f in dataclasses.fields(BenchConfig)}
    shared = sorted(set(args) & set(defaults))
    assert {"honest_groups", "per_worker", "attempts", "history"} <= set(shared)
    assert {k: args[k] for k in shared} == {k: defaults[k] for k in shared}


def test_bench_verify_crowd_section_at_the_smallest_size(capsys):
    """The crowd section alone: one row per attack, identities and lying validators, with the shares trained."""
    assert main(["bench", "verify", "--json", "--group-size", "2", "--max-new-tokens", "8", "--crowd", "only",
                 "--crowd-pool", "3", "--crowd-identities", "1,3"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["cases"] == [] and "history" not in report
    rows = report["crowd"]["rows"]
    assert {(r["attack"], r["identities_per_version"], r["lying_validators"]) for r in rows} == {
        (a, n, liars) for a in ("near_ties_steered", "int8_decoded_reproved") for n in (1, 3) for liars in (0, 1, 2)
    } | {("honest_newcomers", 1, 0), ("honest_newcomers", 3, 0)}
    assert [r["identities_per_version"] for r in rows if r["from_start"]] == [1, 3]
    assert all(r["attack_groups_sent"] == (14 if r["from_start"] else 8) * 2 * r["identities_per_version"]
               for r in rows)
    assert all(r["attack_groups_trained"] <= r["attack_groups_admitted"] <= r["attack_groups_sent"] for r in rows)
    assert all(0.0 <= r["attack_share_of_training"] <= 1.0 and r["groups_trained"] > 0 for r in rows)


def test_bench_verify_refuses_malformed_crowd_identities(capsys):
    assert main(["bench", "verify", "--crowd", "only", "--crowd-identities", "1,x"]) == 2
    assert "--crowd-identities must be positive integers" in capsys.readouterr().err
