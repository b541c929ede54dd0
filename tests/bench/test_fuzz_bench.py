"""`swarm bench fuzz`: JSON with inputs tried per target and every failure with its reproducer; exit 1 on failure."""

from __future__ import annotations

import json

from swarm.bench import fuzz_targets
from swarm.bench.fuzz_targets import FuzzTarget
from swarm.cli.main import main


def test_a_two_second_run_tries_every_target_and_finds_nothing(capsys):
    assert main(["bench", "fuzz", "--seconds", "2", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert set(report["inputs_per_target"]) == set(fuzz_targets.BY_NAME)
    assert all(count > 0 for count in report["inputs_per_target"].values())
    assert report["inputs"] == sum(report["inputs_per_target"].values())
    assert report["failures"] == []


def _crashes_on_a_zero_byte(data: bytes) -> bytes:
    if b"\x00" in data:
        raise RuntimeError("decoder bug")
    raise ValueError("refused")


def test_a_failure_is_reported_with_a_reproducer_and_a_non_zero_exit(capsys, monkeypatch):
    target = FuzzTarget("fragile", _crashes_on_a_zero_byte, lambda: [b"\x01\x02\x03\x04"], (ValueError,))
    monkeypatch.setattr(fuzz_targets, "TARGETS", (target,))
    monkeypatch.setattr(fuzz_targets, "BY_NAME", {"fragile": target})
    assert main(["bench", "fuzz", "--seconds", "0.5", "--json"]) == 1
    report = json.loads(capsys.readouterr().out)
    (failure,) = report["failures"]  # one bug, reported once however often it was hit
    assert failure["target"] == "fragile" and failure["type"] == "RuntimeError"
    assert failure["message"] == "decoder bug" and b"\x00" in bytes.fromhex(failure["input_hex"])


def test_an_unknown_target_is_one_sentence(capsys):
    assert main(["bench", "fuzz", "--seconds", "1", "--target", "nope"]) == 2
    assert "unknown fuzz target 'nope'" in capsys.readouterr().err
