"""`swarm bench generate` runs end to end on the tiny model and reports consistent figures (not a timed test)."""

import json

import torch

from swarm.cli import main


def test_bench_generate_reports_json(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("SWARM_MODEL_CACHE", str(tmp_path))
    threads = torch.get_num_threads()
    try:
        code = main(["bench", "generate", "--model", "tiny", "--json", "--prompts", "2", "--group-size", "2",
                     "--max-new-tokens", "8", "--repeats", "1"])
    finally:
        torch.set_num_threads(threads)  # the bench pins one thread; other tests keep the default
    assert code == 0
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert 4 <= report["tokens"] <= 2 * 2 * 8 and report["threads"] == 1
    assert report["tokens_per_s_with_proofs"] > 0 and report["tokens_per_s_without_proofs"] > 0
    assert report["proof_build_s"] > 0  # proofs were really built in the capture runs
    assert (tmp_path / "tiny-v2" / "config.json").exists()
