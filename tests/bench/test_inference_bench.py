"""The benchmarks `swarm bench generate`, `noise` and `device` run end to end on the tiny model and report
consistent figures (not timed tests)."""

import json

import torch

from swarm.cli.main import main


def bench_report(capsys, *argv: str) -> dict:
    """Run `swarm bench ...` in-process and return its JSON report (the last line printed)."""
    threads = torch.get_num_threads()
    try:
        assert main(["bench", *argv]) == 0
    finally:
        torch.set_num_threads(threads)  # a bench pins one thread; other tests keep the default
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])


def test_bench_generate_reports_json(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("SWARM_MODEL_CACHE", str(tmp_path))
    report = bench_report(capsys, "generate", "--model", "tiny", "--json", "--prompts", "2", "--group-size", "2",
                          "--max-new-tokens", "8", "--repeats", "1")
    assert 4 <= report["tokens"] <= 2 * 2 * 8 and report["threads"] == 1
    assert report["tokens_per_s_with_proofs"] > 0 and report["tokens_per_s_without_proofs"] > 0
    assert report["proof_build_s"] > 0  # proofs were really built in the capture runs
    assert (tmp_path / "tiny-v3" / "config.json").exists()


def test_bench_noise_reports_json_and_agrees_with_the_textbook_draw(capsys):
    report = bench_report(capsys, "noise", "--rows", "3", "--vocab", "5000", "--repeats", "1", "--json")
    assert report["rows"] == 3 and report["vocab"] == 5000 and report["device"] == "cpu"
    assert report["ns_per_element"] > 0 and report["textbook_ns_per_element"] > 0 and report["speedup"] > 0
    assert report["max_abs_difference"] < 1e-5  # the same noise, up to a float32 ulp of the log


def test_bench_device_checks_itself_exactly_on_the_cpu(capsys):
    """On a CPU every device path is the CPU path, so every figure must be exact; on a GPU the same command is the
    prepared check of the accelerator paths."""
    report = bench_report(capsys, "device", "--device", "cpu", "--groups", "2", "--max-new-tokens", "8", "--json")
    assert report["ok"] and report["noise"]["max_abs_difference"] == 0.0
    assert report["generate"]["identical_fraction"] == 1.0 and report["verify"]["first_reason"] == ""
    assert report["train_step"]["weights_max_abs_difference"] == 0.0 and report["train_step"]["skipped"] == ""
