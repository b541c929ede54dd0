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
