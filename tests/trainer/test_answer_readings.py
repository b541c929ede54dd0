"""The lenient readings of `swarm eval --lenient` on hand-made completions, the per-prompt file and `--compare`'s
paired differences."""

from __future__ import annotations

import json

import pytest

from swarm.cli.eval_compare import paired_gains, read_per_prompt
from swarm.cli.main import main
from swarm.errors import UserError
from trainer.answer_readings import any_number_correct, last_number_correct, outcome, reading_accuracy

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.mark.parametrize(("text", "answer", "last", "anywhere"), [
    ("88 + 94 equals 182.", "182", True, True),
    ("To calculate 88 + 94, we need to", "182", False, False),  # cut before its number
    ("88 + 94 = 182. Check: 182 - 94 = 88", "182", False, True),  # right, then other numbers
    ("6 - 8 = -2", "-2", True, True),
    ("6 - 8 = 2", "-2", False, False),  # the sign of a difference is wrong
    ("The sum is 1823", "182", False, False),  # a whole number, not a substring
    ("The result is 1,234.", "1234", True, True),
    ("It is 7.0", "7", True, True),
    ("no number at all", "5", False, False),
    ("the answer is 5", "five", False, False),  # an answer that is not a number reads as wrong
])
def test_the_readings_find_the_last_number_and_any_number(text, answer, last, anywhere):
    assert last_number_correct(text, answer) is last
    assert any_number_correct(text, answer) is anywhere


def test_an_outcome_keeps_the_reward_apart_from_the_readings():
    right_late = outcome(3, "182", "Sure! 88 + 94 = 182. Then 5", 24, 0.0)
    assert not right_late.correct and not right_late.last_number and right_late.any_number
    outcomes = [right_late, outcome(4, "7", "3 + 4 = 7", 6, 1.0)]
    assert [reading_accuracy(outcomes, r) for r in ("reward", "last_number", "any_number")] == [0.5, 0.5, 1.0]
    assert json.loads(json.dumps(right_late.to_dict()))["any_number"] is True


def _rows(*verdicts: tuple[bool, bool, bool]) -> dict[int, dict]:
    return {i: {"reward": r, "last_number": last, "any_number": anywhere}
            for i, (r, last, anywhere) in enumerate(verdicts)}


def test_paired_gains_count_prompts_gained_and_lost_per_reading():
    before = _rows((False, False, True), (True, True, True), (False, False, False), (False, True, True))
    after = _rows((True, True, True), (True, True, True), (False, False, True), (True, False, True))
    gains = paired_gains(before, after)
    assert gains["n"] == 4
    assert gains["reward"]["before"] == 0.25 and gains["reward"]["after"] == 0.75
    assert (gains["reward"]["gained"], gains["reward"]["lost"]) == (2, 0)
    assert gains["reward"]["difference"]["mean"] == 0.5
    assert (gains["last_number"]["gained"], gains["last_number"]["lost"]) == (1, 1)
    assert gains["last_number"]["difference"]["mean"] == 0.0
    low, high = gains["last_number"]["difference"]["ci95"]
    assert low < 0 < high
    assert gains["any_number"]["difference"]["mean"] == 0.25


def test_evaluations_of_different_prompts_are_not_compared():
    with pytest.raises(UserError, match="scored different prompts"):
        paired_gains(_rows((True, True, True)), {5: {"reward": True, "last_number": True, "any_number": True}})


def test_eval_lenient_writes_a_per_prompt_file_that_compare_reads_back(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("SWARM_MODEL_CACHE", str(tmp_path / "cache"))
    path = tmp_path / "before.jsonl"
    flags = ["eval", "--task", "chain_sum", "--n", "3", "--batch", "3", "--max-new-tokens", "4", "--json"]
    assert main([*flags, "--lenient", "--per-prompt", str(path)]) == 0
    shown = json.loads(capsys.readouterr().out)
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert len(rows) == 3 and {"index", "answer", "text", "reward", "last_number", "any_number"} <= set(rows[0])
    assert shown["accuracy"] == sum(r["correct"] for r in rows) / 3
    assert shown["last_number_accuracy"] == sum(r["last_number"] for r in rows) / 3
    assert shown["any_number_accuracy"] == sum(r["any_number"] for r in rows) / 3
    assert main([*flags]) == 0
    assert "last_number_accuracy" not in json.loads(capsys.readouterr().out)
    assert set(read_per_prompt(path)) == {r["index"] for r in rows}
    assert main(["eval", "--compare", str(path), str(path)]) == 0
    out = capsys.readouterr().out
    assert out.count("paired difference +0.000") == 3 and out.startswith("reward: ")


def test_compare_reads_hand_made_per_prompt_files_and_refuses_a_broken_one(tmp_path, capsys):
    def line(index, correct, last, anywhere):
        return json.dumps({"index": index, "correct": correct, "last_number": last, "any_number": anywhere}) + "\n"

    before, after = tmp_path / "before.jsonl", tmp_path / "after.jsonl"
    before.write_text(line(0, False, False, True) + line(1, False, False, False))
    after.write_text(line(1, True, True, True) + line(0, True, True, True))
    assert main(["eval", "--compare", str(before), str(after), "--json"]) == 0
    gains = json.loads(capsys.readouterr().out)
    assert gains["reward"]["difference"]["mean"] == 1.0 and gains["any_number"]["gained"] == 1
    after.write_text(line(0, True, True, True) + '{"index": 1}\n')
    assert main(["eval", "--compare", str(before), str(after)]) == 2
    assert f"{after} line 2 is not a `swarm eval --per-prompt` line" in capsys.readouterr().err
