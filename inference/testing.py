"""Helpers for testing generation backends: requests over the tiny model, and a reference prefill as the oracle."""

from __future__ import annotations

import torch

from inference.backend import GenerationRequest
from tasks import load_tasks, render_prompt_tokens
from verify.sampling import SamplingKey


def requests_for(loaded, *, count=3, group=2, temperature=1.0, max_new_tokens=12, step=0, seed=5):
    tasks = load_tasks("basic_arithmetic", size=count, seed=seed)
    return [GenerationRequest(prompt_tokens=tuple(render_prompt_tokens(loaded.tokenizer, e)),
                              keys=tuple(SamplingKey("run", "w", step, e.index, s) for s in range(group)),
                              temperature=temperature, max_new_tokens=max_new_tokens) for e in tasks]


@torch.no_grad()
def prefill(model, prompt, completion):
    """(logits [T, V], LM-head inputs [T, H]) at the positions that produced each generated token, in one pass."""
    captured = {}
    handle = model.get_output_embeddings().register_forward_pre_hook(lambda m, a: captured.update(h=a[0]))
    try:
        ids = torch.tensor([list(prompt) + list(completion)])
        logits = model(input_ids=ids).logits[0]
    finally:
        handle.remove()
    start = len(prompt) - 1
    return logits[start:start + len(completion)], captured["h"][0, start:start + len(completion)]
