"""Held-out accuracy: greedy, batched generation on prompts the trainer never sees.

Why greedy and held-out: accuracy must measure the policy, not the sampler's luck or memorised training prompts.
The held-out split comes from TaskSet.split (seeded by index, never overlapping the training split), and the
`n` prompts are a seeded, deterministic pick from it, so two evaluations of two policies compare like with like.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

from inference.backend import GenerationRequest
from inference.torch_backend import TorchBackend
from tasks import render_prompt_tokens
from tasks.assignment import assign_tasks
from trainer.answer_readings import SOLVED, PromptOutcome, outcome
from verify.rewards import compute_reward
from verify.sampling import SamplingKey


@dataclass(frozen=True)
class EvalResult:
    accuracy: float  # share of prompts whose greedy completion earns reward 1
    mean_reward: float
    n: int
    mean_tokens: float  # mean completion length
    outcomes: tuple[PromptOutcome, ...] = ()  # per prompt, in scoring order: the completion and every reading


def pick_prompts(heldout, n: int, seed: int) -> list[int]:
    """A seeded, deterministic choice of min(n, len) distinct held-out indices."""
    return sorted(assign_tasks("eval", "heldout", seed, heldout.indices(), min(n, len(heldout))))


def evaluate(loaded, heldout, *, n: int, seed: int, max_new_tokens: int, temperature: float = 0.0,
             batch: int = 32, backend: TorchBackend | None = None,
             on_progress: Callable[[int, int], None] = lambda done, total: None) -> EvalResult:
    """Accuracy of `loaded`'s model (or `backend`'s) on `n` held-out prompts, `batch` prompts per generate call;
    `on_progress(prompts scored, prompts in all)` hears each batch (a CPU evaluation takes minutes)."""
    backend = backend or TorchBackend(loaded, capture_proofs=False, max_batch_rows=batch)
    indices = pick_prompts(heldout, n, seed)
    rewards, lengths, outcomes = [], [], []
    on_progress(0, len(indices))
    for start in range(0, len(indices), batch):
        chunk = indices[start:start + batch]
        requests = [GenerationRequest(tuple(render_prompt_tokens(loaded.tokenizer, heldout[i])),
                                      (SamplingKey("eval", "heldout", seed, i, 0),), temperature, max_new_tokens)
                    for i in chunk]
        for index, result in zip(chunk, backend.generate(requests)):
            tokens = result.completions[0].tokens
            text = loaded.tokenizer.decode(list(tokens), skip_special_tokens=True)
            entry = heldout[index]
            rewards.append(compute_reward(entry.reward_fn, text, entry.to_dict()))
            lengths.append(len(tokens))
            outcomes.append(outcome(index, entry.answer, text, len(tokens), rewards[-1]))
        on_progress(len(rewards), len(indices))
    n_done = max(len(rewards), 1)
    return EvalResult(accuracy=sum(r >= SOLVED for r in rewards) / n_done, mean_reward=sum(rewards) / n_done,
                      n=len(rewards), mean_tokens=sum(lengths) / n_done, outcomes=tuple(outcomes))


def constant_answer_accuracy(train, heldout, *, n: int, seed: int) -> tuple[str, float]:
    """The training split's most frequent answer, and the accuracy of answering it to every prompt `evaluate`
    scores. Why: a small policy's first gain is often learning that answer (gcd's is 1); held-out accuracy above
    this line is the part that depends on the question."""
    counts = Counter(train[i].answer for i in train.indices())
    answer = min(counts, key=lambda a: (-counts[a], a)) if counts else ""
    indices = pick_prompts(heldout, n, seed)
    right = sum(compute_reward(heldout[i].reward_fn, answer, heldout[i].to_dict()) >= SOLVED for i in indices)
    return answer, right / max(len(indices), 1)
