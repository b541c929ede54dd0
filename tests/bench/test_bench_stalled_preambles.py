"""`swarm bench stalled-preambles` at its smallest: one identity, one channel, the largest preamble, a one-second
hold. It prints one JSON object with the target's memory and CPU over the attack, and the target outlives the attack."""

from __future__ import annotations

import json

from swarm.cli.main import main


def test_a_tiny_run_prints_the_targets_cost_as_json_and_the_target_survives(capsys):
    argv = ["bench", "stalled-preambles", "--identities", "1", "--channels", "1", "--declared-kib", "64",
            "--hold", "1", "--settle", "0", "--json"]
    assert main(argv) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["identities"] == 1 and report["channels_each"] == 1 and report["declared_kib"] == 64
    assert report["target_alive"] is True
    assert report["baseline_rss_mib"] > 0 and report["peak_rss_mib"] >= report["baseline_rss_mib"]
    assert report["cpu_s"] is not None and report["wall_s"] >= 1
    assert report["attack_bytes_sent_kib"] == 63.0  # the preamble went out: all of 64 KiB but its last KiB


def test_nonsense_sizes_are_one_sentence(capsys):
    assert main(["bench", "stalled-preambles", "--identities", "0"]) == 2
    assert "--identities" in capsys.readouterr().err
