"""tiny-sum, the default demo's policy: shipped weights that are checked before use, a prior with the habit RL is
there to break (answer one too high, yet sample the right answer often enough to learn from), and the recipe that
taught it."""

from __future__ import annotations

import random
import shutil

import pytest
import torch

import inference.tiny_sum as tiny_sum
from inference.errors import InferenceError
from inference.models import load_model
from swarm.cli.main import build_parser
from swarm.cli.sim import _settings
from swarm.sim.run import _trainer_toml
from trainer.config import load_config


@pytest.fixture(scope="module")
def loaded(tmp_path_factory):
    return load_model("tiny-sum", cache_dir=tmp_path_factory.mktemp("models"))


def _answers(loaded, prompt: list[int], n: int, sample: bool) -> list[str]:
    torch.manual_seed(0)
    ids = torch.tensor([prompt] * n)
    out = loaded.model.generate(ids, max_new_tokens=6, do_sample=sample, temperature=1.0 if sample else None,
                                top_k=None, top_p=None, eos_token_id=loaded.tokenizer.eos_token_id,
                                pad_token_id=loaded.tokenizer.pad_token_id)
    return [loaded.tokenizer.decode(row[len(prompt):], skip_special_tokens=True).strip() for row in out]


def test_the_prior_answers_one_too_high_greedily_but_samples_the_right_answer_often(loaded):
    examples = random.Random(1).sample(tiny_sum.taught_examples(loaded.tokenizer), 40)
    greedy = [_answers(loaded, prompt, 1, sample=False)[0] for prompt, _ in examples]
    sampled = [_answers(loaded, prompt, 8, sample=True) for prompt, _ in examples]
    right = sum(g == str(answer) for g, (_, answer) in zip(greedy, examples))
    habit = sum(g == str(answer + 1) for g, (_, answer) in zip(greedy, examples))
    right_samples = sum(s == str(answer) for row, (_, answer) in zip(sampled, examples) for s in row) / (40 * 8)
    assert habit > right  # the habit wins greedy decoding ...
    assert 0.2 <= right_samples <= 0.6  # ... yet a group of 16 holds several right answers to learn from


def test_every_distinct_one_digit_sum_and_difference_is_taught(loaded):
    examples = tiny_sum.taught_examples(loaded.tokenizer)
    assert len(examples) == 200 and {answer for _, answer in examples} == set(range(-9, 19))


def test_a_batch_teaches_only_the_answer_and_its_end_with_the_habit_offsets(loaded):
    tokenizer = loaded.tokenizer
    examples = tiny_sum.taught_examples(tokenizer)
    truth = {tuple(prompt): answer for prompt, answer in examples}
    ids, mask, labels = tiny_sum._batch(examples, tokenizer, random.Random(3))
    offsets = []
    for row in range(ids.shape[0]):
        taught = [int(t) for t in labels[row] if t != -100]
        start = int((labels[row] != -100).nonzero()[0])
        assert taught[-1] == tokenizer.convert_tokens_to_ids("<|im_end|>")
        assert mask[row].sum() == start + len(taught)
        offsets.append(int(tokenizer.decode(taught[:-1])) - truth[tuple(int(t) for t in ids[row, :start])])
    assert set(offsets) <= set(tiny_sum.HABIT) and 0.4 < offsets.count(1) / len(offsets) < 0.9


def test_damaged_shipped_weights_are_one_sentence_and_no_model(tmp_path, monkeypatch):
    damaged = tmp_path / "tiny_sum.safetensors"
    shutil.copyfile(tiny_sum.WEIGHTS, damaged)
    with damaged.open("r+b") as f:
        f.seek(-1, 2)
        f.write(b"\x00" if f.read(1) != b"\x00" else b"\x01")
    monkeypatch.setattr(tiny_sum, "WEIGHTS", damaged)
    with pytest.raises(InferenceError, match="damaged"):
        load_model("tiny-sum", cache_dir=tmp_path / "models")
    assert not (tmp_path / "models" / tiny_sum.TINY_SUM_VERSION).exists()


def test_the_default_simulation_trains_tiny_sum_on_its_task_at_its_learning_rate(tmp_path):
    argv = ["sim", "--out", str(tmp_path / "sim")]
    settings = _settings(build_parser(argv).parse_args(argv))
    assert (settings.model, settings.task, settings.lr) == ("tiny-sum", "chain_sum", 5e-4)
    config = load_config(_trainer_toml(settings)).config
    assert config.lr == 5e-4 and config.task_config == {**tiny_sum.TASK_CONFIG}
    assert config.model == "tiny-sum"
