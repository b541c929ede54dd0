"""Held-out evaluation's reference line, and the tiny model's prior that an answer ends after its number."""

from __future__ import annotations

import pytest
import torch

from tasks.taskset import TaskEntry, TaskSet
from trainer.evaluate import constant_answer_accuracy, pick_prompts

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _tasks(answers: list[str]) -> TaskSet:
    return TaskSet("t", [TaskEntry("t", i, f"q{i}", a, reward_fn="numeric") for i, a in enumerate(answers)])


def test_the_constant_answer_line_is_the_most_frequent_training_answer_scored_on_the_evaluated_prompts():
    train = _tasks(["1", "2", "1", "3", "1", "2"])
    heldout = _tasks(["1", "4", "1.0", "5", "2", "1", "7", "8"])
    answer, accuracy = constant_answer_accuracy(train, heldout, n=8, seed=0)
    assert answer == "1" and accuracy == 3 / 8  # "1.0" is numerically 1
    picked = pick_prompts(heldout, 4, seed=3)
    _, on_four = constant_answer_accuracy(train, heldout, n=4, seed=3)
    assert on_four == sum(heldout[i].answer in ("1", "1.0") for i in picked) / 4


def test_ties_between_training_answers_are_broken_the_same_way_on_every_peer():
    train = _tasks(["7", "3", "3", "7"])
    assert constant_answer_accuracy(train, _tasks(["3"]), n=1, seed=0) == ("3", 1.0)


def test_the_tiny_model_ends_after_a_number_and_rarely_elsewhere(tiny):
    """Right after a number token <|im_end|> is the likeliest next token; after other tokens it stays rare, so
    sampled completions are not cut short before they answer."""
    tokenizer, model = tiny.tokenizer, tiny.model
    eos = tokenizer.convert_tokens_to_ids("<|im_end|>")
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": "What is the gcd of 12 and 18?"}],
                                           tokenize=False, add_generation_prompt=True)
    ids = tokenizer(prompt)["input_ids"]
    after_number = ids + tokenizer("6")["input_ids"]
    after_word = ids + tokenizer("The")["input_ids"]
    with torch.no_grad():
        probs = [torch.softmax(model(torch.tensor([x])).logits[0, -1], -1) for x in (after_number, after_word, ids)]
    assert int(probs[0].argmax()) == eos and probs[0][eos] > 0.5
    assert probs[1][eos] < 0.1 and probs[2][eos] < 0.1
