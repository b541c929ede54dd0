"""Dishonest workers for `swarm bench verify`: tampered weights and tampered rollouts.

Why each attack exists (what a cheating worker gains): a cheaper or different model (another model, int8 copy,
a smaller model whose tokens are then proven by prefill with the right model), edited completions (replaced
tokens, truncation), a different sampling temperature, a fabricated reward, a cherry-picked prompt, and a replay
of old rollouts; and the attacks that live in the per-group allowances: steering every near-tie within the
sampling check's budget, and near-duplicate resubmissions of an accepted group (a jittered logprob, a subset,
a new order) that would count one rollout twice. The strongest forms are used: where an attacker can recompute
the proofs and logprobs of its edited tokens with the right model by one prefill, it does, so only the check
that owns the attack can catch it.
"""

from __future__ import annotations

import copy
import dataclasses
import random

import torch

from verify.checks import recomputed_logprobs
from verify.rollout import RolloutGroup
from verify.toploc import build_proofs


def clone_model(model: torch.nn.Module) -> torch.nn.Module:
    """A fresh module of the same class and config holding a copy of the weights (no hooks carried over)."""
    clone = type(model)(copy.deepcopy(model.config)).eval()
    clone.load_state_dict({k: v.detach().clone() for k, v in model.state_dict().items()})
    return clone


def other_model(model: torch.nn.Module, seed: int) -> torch.nn.Module:
    """Same shape, fresh weights: every tensor redrawn with its own mean and std (norm gains stay as they are)."""
    clone = clone_model(model)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in clone.parameters():
            if p.numel() > 1 and float(p.std()) > 0:
                p.copy_(torch.randn(p.shape, generator=generator) * p.std() + p.mean())
    return clone


def perturbed_model(model: torch.nn.Module, relative: float, seed: int) -> torch.nn.Module:
    """Every weight times (1 + relative * N(0, 1))."""
    clone = clone_model(model)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in clone.parameters():
            p.mul_(1 + relative * torch.randn(p.shape, generator=generator))
    return clone


def int8_model(model: torch.nn.Module) -> torch.nn.Module:
    """Each matrix quantised to int8 with one symmetric scale per output row, then dequantised."""
    clone = clone_model(model)
    with torch.no_grad():
        for p in clone.parameters():
            if p.ndim == 2:
                scale = p.abs().amax(dim=1, keepdim=True).clamp(min=1e-12) / 127
                p.copy_((p / scale).round().clamp(-127, 127) * scale)
    return clone


def smaller_model(model: torch.nn.Module, seed: int) -> torch.nn.Module:
    """One layer and half the width, same vocabulary: a cheap model whose tokens the attacker passes off."""
    config = copy.deepcopy(model.config)
    config.num_hidden_layers = 1
    config.hidden_size = max(32, config.hidden_size // 2)
    config.intermediate_size = max(64, config.intermediate_size // 2)
    torch.manual_seed(seed)
    return type(model)(config).eval()


@torch.no_grad()
def reprove(model: torch.nn.Module, group: RolloutGroup) -> RolloutGroup:
    """Recompute every completion's proof and logprobs with `model` by prefill (what a clever attacker does)."""
    completions, hiddens = [], []
    for c in group.completions:
        ids = torch.tensor([list(group.prompt_tokens) + list(c.tokens[:-1])])
        out = model(input_ids=ids, output_hidden_states=True)
        start = len(group.prompt_tokens) - 1
        hiddens.append(out.hidden_states[-1][0, start:].float())
        lps = recomputed_logprobs(out.logits[0, start:], c.tokens, group.temperature)
        completions.append(dataclasses.replace(c, logprobs=tuple(min(0.0, float(x)) for x in lps)))
    proofs = build_proofs(hiddens)
    return dataclasses.replace(group, completions=tuple(
        dataclasses.replace(c, proof=p) for c, p in zip(completions, proofs)))


def replace_tokens(group: RolloutGroup, k: int, vocab_size: int, avoid: tuple[int, ...], seed: int) -> RolloutGroup:
    """k tokens of every completion (never the last) replaced by other random ids."""
    rng = random.Random(seed)
    out = []
    for c in group.completions:
        tokens = list(c.tokens)
        for pos in rng.sample(range(max(1, len(tokens) - 1)), min(k, max(1, len(tokens) - 1))):
            choices = [t for t in (rng.randrange(vocab_size) for _ in range(8)) if t not in avoid and t != tokens[pos]]
            tokens[pos] = choices[0] if choices else tokens[pos]
        out.append(dataclasses.replace(c, tokens=tuple(tokens)))
    return dataclasses.replace(group, completions=tuple(out))


def truncate(group: RolloutGroup) -> RolloutGroup:
    """Every completion cut to half its length, claimed to have hit the length limit."""
    out = []
    for c in group.completions:
        keep = max(1, len(c.tokens) // 2)
        out.append(dataclasses.replace(c, tokens=c.tokens[:keep], logprobs=c.logprobs[:keep], finish_reason="length"))
    return dataclasses.replace(group, completions=tuple(out))


def fabricate_reward(group: RolloutGroup) -> RolloutGroup:
    """Claim full reward (or zero where the honest reward was already full)."""
    return dataclasses.replace(group, completions=tuple(
        dataclasses.replace(c, reward=0.0 if c.reward >= 1.0 else 1.0) for c in group.completions))


class NearTieSteerer:
    """A `choose` rule for verify.testing.generate_group: the seeded sample, except that wherever the runner-up's
    perturbed score is within `tol` of the best it takes the runner-up (a worker steering toward the tokens it
    prefers), as often as the group's near-tie allowance lets every group still pass (`fraction` of the tokens
    decoded so far, at least one). Logprobs are the right model's, so only the flip count betrays it."""

    def __init__(self, tol: float = 0.02, fraction: float = 0.01) -> None:
        self.tol, self.fraction = tol, fraction
        self.tokens = self.flips = 0

    def __call__(self, logits: torch.Tensor, noise: torch.Tensor, temperature: float, live: torch.Tensor):
        from verify.sampling import perturbed_scores

        top = perturbed_scores(logits, noise, temperature).topk(2, dim=-1)
        tokens = top.indices[:, 0].clone()
        self.tokens += int(live.sum())
        for row in torch.nonzero(live & (top.values[:, 0] - top.values[:, 1] <= self.tol)).flatten().tolist():
            if self.flips + 1 <= max(1, int(self.fraction * self.tokens)):
                tokens[row] = top.indices[row, 1]
                self.flips += 1
        scaled = logits.float() / (temperature if temperature > 0 else 1.0)
        return tokens, torch.log_softmax(scaled, dim=-1).gather(-1, tokens[:, None]).squeeze(-1)


def jitter_logprob(group: RolloutGroup, delta: float) -> RolloutGroup:
    """The same group with its first logprob moved by `delta` (inside the tolerance): new bytes, same rollout."""
    first = group.completions[0]
    moved = dataclasses.replace(first, logprobs=(min(0.0, first.logprobs[0] + delta),) + first.logprobs[1:])
    return dataclasses.replace(group, completions=(moved,) + group.completions[1:])


def completion_subset(group: RolloutGroup) -> RolloutGroup:
    """The group without its last completion (a resubmission of completions already sent)."""
    return dataclasses.replace(group, completions=group.completions[:-1])


def reorder_completions(group: RolloutGroup) -> RolloutGroup:
    """The group's completions in reverse order (the same completions, new bytes)."""
    return dataclasses.replace(group, completions=tuple(reversed(group.completions)))
