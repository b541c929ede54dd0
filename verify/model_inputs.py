"""How token lists become model inputs, the same way for the generator, the verifier and the trainer.

Why here: verify/ is the lowest layer that runs models (inference/ and trainer/ import it, never the reverse), and
this module imports only torch, so the generator can use it without loading the verifier.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Sequence

import torch


def left_padded(prompts: Sequence[Sequence[int]], pad_id: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """(ids [P, W], attention mask [P, W]) with every prompt right-aligned, so each one's last token is the last
    column (where the next token's logits are read). Padded positions are masked: any valid pad id will do."""
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for i, p in enumerate(prompts):
        ids[i, width - len(p) :] = torch.tensor(list(p), dtype=torch.long)
        mask[i, width - len(p) :] = 1
    return ids, mask


def cache_keyword(module) -> str:
    """The name of `module.forward`'s KV-cache argument: transformers 5.2x renamed `past_key_values` to `cache`;
    older releases (vLLM pins) know only the first."""
    return "cache" if _forward_takes_cache(type(module)) else "past_key_values"


@functools.lru_cache(maxsize=None)
def _forward_takes_cache(module_type: type) -> bool:
    return "cache" in inspect.signature(module_type.forward).parameters


def length_buckets(lengths: Sequence[int], pass_cost: int) -> list[list[int]]:
    """Row indices split into passes that minimise padded tokens + `pass_cost` per pass (each pass is padded to
    its longest row).

    Why: a right-padded pass computes every padded position in full, and a group's completions differ in length
    (one stops at EOS after 5 tokens, another runs to the limit), so one pass over a batch of them wastes a third or
    more of its work. Sorted by length, the best split into contiguous runs is an exact dynamic programme (a run
    is never improved by taking a row from outside its length range). `pass_cost` prices a forward call's own
    overhead in padded tokens. Each bucket is sorted by row index; buckets come longest first.
    """
    order = sorted(range(len(lengths)), key=lambda r: lengths[r])
    if not order:
        return []
    sizes = torch.tensor([lengths[r] for r in order], dtype=torch.float64)
    best = torch.zeros(len(order) + 1, dtype=torch.float64)  # best[j]: cost of the j shortest rows
    start = [0] * (len(order) + 1)
    for j in range(1, len(order) + 1):
        firsts = torch.arange(j, dtype=torch.float64)  # the run is order[i:j] for i = 0 .. j-1
        costs = best[:j] + (j - firsts) * sizes[j - 1] + pass_cost
        i = int(torch.argmin(costs))
        best[j], start[j] = costs[i], i
    buckets, j = [], len(order)
    while j > 0:
        buckets.append(sorted(order[start[j]:j]))
        j = start[j]
    return buckets
