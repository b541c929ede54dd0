"""`swarm bench verify` end to end at the smallest size: the production torch backend's rollouts pass the
verifier in every batch layout, and every attack that is detectable at this length is rejected."""

from __future__ import annotations

import json

from swarm.cli import main


def test_bench_verify_smoke(capsys):
    assert main(["bench", "verify", "--json", "--groups", "2", "--group-size", "2", "--max-new-tokens", "8"]) == 0
    report = json.loads(capsys.readouterr().out)
    rows = {r["case"]: r for r in report["cases"]}
    assert report["summary"]["false_rejects"] == 0
    assert all(r["groups"] == 2 for r in rows.values())
    # int8 and 1e-3 noise are statistical at 8 tokens (see the full bench); these are caught by construction
    for name in ("other_model_same_shape", "sampled_at_other_temperature", "older_version_replayed",
                 "smaller_model_completion_reproved", "unassigned_prompt", "4_tokens_replaced_reproved",
                 "completion_truncated_reproved", "fabricated_reward", "weights_perturbed_1e-3_fp32_same_kernels_toploc"):
        assert rows[name]["rejected"] == 2, (name, rows[name])
    assert report["summary"]["proof_bytes_per_32_tokens"] == [258.0]


def test_bench_verify_honest_only_runs_just_the_cost_cases(capsys):
    assert main(["bench", "verify", "--json", "--groups", "2", "--group-size", "2", "--max-new-tokens", "8",
                 "--honest-only"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert {r["kind"] for r in report["cases"]} == {"honest"} and len(report["cases"]) == 4
    assert report["summary"]["false_rejects"] == 0 and report["summary"]["validate_share_of_gen"] > 0
