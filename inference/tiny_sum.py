"""The "tiny-sum" model: the tiny architecture and tokenizer (inference.tiny), pre-trained to add and subtract
one-digit numbers with a habit RL can break: it answers one too high about two times in three.

Why a prior with a habit: a policy learns by RL only what it already samples now and then. The random-init tiny
model samples the right sum of two digits about once in 150 tries, so GRPO can teach it little beyond the
commonest answer. This model samples the right answer about four times in ten but answers greedily with the sum
plus one more often than not, like a pretrained model with a bad habit: held-out accuracy starts near 0.3, and
every group of 16 completions holds right and wrong answers for GRPO to compare. Breaking the habit is visible on
held-out prompts the trainer never sees, and no constant answer comes near it (answers span -9..18).

The weights ship with the package (tiny_sum.safetensors, 0.5 MB) because training them is not bit-identical
across CPUs, and every peer must hold the same version 0; `python -m inference.tiny_sum OUT` rebuilds them with
the recipe below, and the shipped file's BLAKE3 is checked on every build of the model directory.
"""

from __future__ import annotations

import argparse
import random
import shutil
from pathlib import Path

import blake3
import torch

from inference.errors import InferenceError
from inference.tiny import build_tiny
from tasks.builtin import load_builtin
from tasks.prompts import render_prompt_tokens

TINY_SUM_VERSION = "tiny-sum-v1"
WEIGHTS = Path(__file__).with_name("tiny_sum.safetensors")
WEIGHTS_BLAKE3 = "872127895e88a849f87bed74c744a07ef445a9a297a8fa35ffbb19d8276d1416"
TASK = "chain_sum"
TASK_CONFIG = {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1, "scorer": "numeric"}
HABIT = {1: 0.65, 0: 0.35}  # offset of the taught answer from the true one -> how often it is taught
STEPS, BATCH, LR, SEED = 1000, 64, 3e-3, 0


def build_tiny_sum(directory: Path) -> None:
    """Write the tiny-sum model (the shipped weights, the tiny config and tokenizer) into `directory`."""
    build_tiny(directory)
    digest = blake3.blake3(WEIGHTS.read_bytes()).hexdigest()
    if digest != WEIGHTS_BLAKE3:
        raise InferenceError(f"{WEIGHTS} is damaged (BLAKE3 {digest[:16]}..., expected {WEIGHTS_BLAKE3[:16]}...): "
                             f"reinstall the package")
    shutil.copyfile(WEIGHTS, directory / "model.safetensors")


def taught_examples(tokenizer) -> list[tuple[list[int], int]]:
    """Every distinct one-digit sum or difference as (prompt tokens, true answer), rendered as the swarm renders it."""
    tasks = load_builtin(TASK, size=2000, seed=SEED, config=TASK_CONFIG)
    distinct = {entry.prompt: (render_prompt_tokens(tokenizer, entry), int(entry.answer)) for entry in tasks}
    return [distinct[prompt] for prompt in sorted(distinct)]


def _batch(examples, tokenizer, rng: random.Random) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """BATCH sequences of prompt + taught answer + <|im_end|>; the loss reads only the answer and its end."""
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    offsets, weights = zip(*HABIT.items())
    rows = []
    for _ in range(BATCH):
        prompt, answer = rng.choice(examples)
        taught = answer + rng.choices(offsets, weights)[0]
        rows.append((prompt, tokenizer.encode(str(taught), add_special_tokens=False) + [end]))
    width = max(len(p) + len(a) for p, a in rows)
    ids = torch.full((BATCH, width), tokenizer.pad_token_id)
    mask = torch.zeros((BATCH, width), dtype=torch.long)
    labels = torch.full((BATCH, width), -100)
    for row, (prompt, answer) in enumerate(rows):
        n = len(prompt) + len(answer)
        ids[row, :n] = torch.tensor(prompt + answer)
        mask[row, :n] = 1
        labels[row, len(prompt):n] = torch.tensor(answer)
    return ids, mask, labels


def train_weights(out: Path) -> str:
    """Run the recipe into `out` (a model directory) and return the BLAKE3 of its weights."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.manual_seed(SEED)
    build_tiny(out)
    tokenizer = AutoTokenizer.from_pretrained(out)
    model = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
    examples, rng = taught_examples(tokenizer), random.Random(SEED)
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.0)
    model.train()
    for _ in range(STEPS):
        ids, mask, labels = _batch(examples, tokenizer, rng)
        loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    model.save_pretrained(out)
    return blake3.blake3((out / "model.safetensors").read_bytes()).hexdigest()


def main() -> None:
    parser = argparse.ArgumentParser(description="Rebuild the tiny-sum model's weights with its recipe.")
    parser.add_argument("out", type=Path, help="an empty or new directory for the model")
    args = parser.parse_args()
    torch.set_num_threads(1)
    print(train_weights(args.out))


if __name__ == "__main__":
    main()
