"""A run's precision sets its validators' tolerances: bf16 workers (vLLM on GPUs) checked by float32 validators.

bf16 logits differ between two honest kernels by far more than float32 ones, so the float32 tolerances reject
honest bf16 work; the bfloat16 profile accepts it and still rejects the attacks (the full figures: `swarm bench
verify --precision bfloat16`, docs/security.md)."""

from __future__ import annotations

import dataclasses

import pytest

from swarm.bench.verify_harness import BenchConfig, Harness
from swarm.errors import UserError
from swarm.policy.runspec import RunSpec
from swarm.roles.validator import check_config
from verify.checks import CheckConfig


def test_profiles_widen_only_the_float_sensitive_tolerances():
    assert CheckConfig.for_precision("float32") == CheckConfig()
    bf16 = CheckConfig.for_precision("bfloat16", min_eos_prob=0.0)
    assert bf16.near_tie_tol > CheckConfig().near_tie_tol and bf16.logprob_atol > CheckConfig().logprob_atol
    assert bf16.max_near_tie_fraction > CheckConfig().max_near_tie_fraction and bf16.min_eos_prob == 0.0
    assert bf16.reward_atol == CheckConfig().reward_atol and bf16.toploc == CheckConfig().toploc
    with pytest.raises(ValueError, match="unknown precision 'fp8'"):
        CheckConfig.for_precision("fp8")


def test_the_manifest_names_the_precision_and_older_manifests_mean_float32():
    spec = RunSpec("basic_arithmetic", 64, "{}", 0, 0.2, "all", 2, 2, 2, 2, ("ab" * 32,), "bfloat16")
    assert RunSpec.from_model({"run_spec": spec.to_dict()}) == spec
    assert check_config(spec) == CheckConfig.for_precision("bfloat16", min_eos_prob=0.0)
    older = {k: v for k, v in spec.to_dict().items() if k != "precision"}
    assert RunSpec.from_model({"run_spec": older}).precision == "float32"
    with pytest.raises(UserError, match="unknown precision 'int4'"):
        RunSpec.from_model({"run_spec": {**spec.to_dict(), "precision": "int4"}})


def test_bf16_workers_pass_the_bf16_tolerances_and_cheats_do_not():
    h = Harness(BenchConfig(groups=6, group_size=2, max_new_tokens=32, precision="bfloat16"))
    honest, _, _ = h.generate(h.model, h.items("honest"))
    verdicts, _ = h.validate(honest)
    assert all(v.accepted for v in verdicts), [v.reason for v in verdicts if not v.accepted]
    float32_tolerances = CheckConfig.for_precision("float32", min_eos_prob=0.0)
    assert not all(v.accepted for v in h.validate(honest, config=float32_tolerances)[0])  # why the profile exists
    hotter, _, _ = h.generate(h.model, h.items("hot"), temperature=1.5 * h.config.temperature)
    claimed = [dataclasses.replace(g, temperature=h.config.temperature) for g in hotter]
    assert not any(v.accepted for v in h.validate(claimed)[0])
