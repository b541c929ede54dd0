"""Seeded Gumbel-max sampling, shared by inference (to sample) and validators (to re-derive the samples).

Why: TOPLOC binds a completion to the policy's hidden states but not to how tokens were chosen. With Gumbel-max
sampling, token_t = argmax(logits_t / T + g_t), where the Gumbel noise g_t is a pure function of the rollout's
assignment (run, worker, step, task index, completion index) and the position t. Sampling from the softmax is
preserved exactly (the Gumbel-max trick), yet a validator who recomputes the logits by prefill re-derives every
sampled token; it tolerates only rare near-ties caused by numerical differences between kernels.

The noise comes from torch's CPU Mersenne-Twister generator seeded with a 64-bit BLAKE3 digest, so it is bitwise
reproducible on every machine, whatever device computes the logits.
"""

from __future__ import annotations

from dataclasses import dataclass

import blake3
import torch

# Uniforms are clamped away from 0 and 1 so that -log(-log(u)) stays finite.
_U_EPS = 1e-10


@dataclass(frozen=True)
class SamplingKey:
    """Everything that fixes one completion's noise stream.

    run: the run's name; worker: the generating peer's id (its libp2p peer id, or a name in local runs);
    step: the policy step the assignment was made for; task_index: index of the prompt in its dataset;
    sample: which of the group's n completions (0..n-1).
    """

    run: str
    worker: str
    step: int
    task_index: int
    sample: int

    def seed_at(self, position: int) -> int:
        """The 63-bit generator seed for generated position `position` (0 = first generated token)."""
        material = f"gumbel-v1\x00{self.run}\x00{self.worker}\x00{self.step}\x00{self.task_index}\x00{self.sample}\x00{position}"
        return int.from_bytes(blake3.blake3(material.encode()).digest()[:8], "little") >> 1


def gumbel_noise(key: SamplingKey, position: int, vocab_size: int) -> torch.Tensor:
    """Gumbel(0, 1) noise of shape [vocab_size], float32, on the CPU; identical on every machine."""
    generator = torch.Generator(device="cpu")
    generator.manual_seed(key.seed_at(position))
    uniform = torch.rand(vocab_size, generator=generator, dtype=torch.float64).clamp_(_U_EPS, 1.0 - _U_EPS)
    return (-torch.log(-torch.log(uniform))).to(torch.float32)


def gumbel_noise_batch(keys: list[SamplingKey], positions: list[int], vocab_size: int) -> torch.Tensor:
    """Noise for a decoding batch: row i belongs to keys[i] at positions[i]. Shape [len(keys), vocab_size]."""
    return torch.stack([gumbel_noise(k, p, vocab_size) for k, p in zip(keys, positions)])


def perturbed_scores(logits: torch.Tensor, noise: torch.Tensor, temperature: float) -> torch.Tensor:
    """logits / T + g in float32; argmax of this is the sampled token. Temperature 0 means greedy (noise ignored)."""
    logits = logits.float()
    if temperature <= 0.0:
        return logits
    return logits / temperature + noise.to(logits.device)


def sample_tokens(logits: torch.Tensor, noise: torch.Tensor, temperature: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Sample one token per row. logits, noise: [B, V]. Returns (tokens [B] int64, sampling logprobs [B] float32).

    The logprob is that of the chosen token under softmax(logits / T), the distribution Gumbel-max samples from.
    """
    scores = perturbed_scores(logits, noise, temperature)
    tokens = scores.argmax(dim=-1)
    scaled = logits.float() / (temperature if temperature > 0 else 1.0)
    logprobs = torch.log_softmax(scaled, dim=-1).gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
    return tokens, logprobs
