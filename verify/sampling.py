"""Seeded Gumbel-max sampling, shared by inference (to sample) and validators (to re-derive the samples).

Why: TOPLOC binds a completion to the policy's hidden states but not to how tokens were chosen. With Gumbel-max
sampling, token_t = argmax(logits_t / T + g_t), where the Gumbel noise g_t is a pure function of the rollout's
assignment (run, worker, step, task index, completion index) and the position t. Sampling from the softmax is
preserved exactly (the Gumbel-max trick), yet a validator who recomputes the logits by prefill re-derives every
sampled token; it tolerates only rare near-ties caused by numerical differences between kernels.

The noise is a counter-based hash, so the noise of any set of (completion, position) pairs is one vectorised draw:
a completion's 64-bit stream seed is a BLAKE3 digest of its key (hashed once per completion, not per token); the
seed of position t is SplitMix64's output t of that stream, and entry v of the row is SplitMix64's output v of the
position's seed. The top 53 bits give a uniform u in (0, 1) (never 0 or 1); g = -log(e) with e = -log(u) taken in
float64 (near u = 1 it needs every bit) and rounded to float32 before the second log. Integer work is exact
(uint64 wraps), so the noise is identical on every machine up to a last-ulp difference of a vectorised log, which
the validator's near-tie tolerance absorbs. The generator (one draw per decoding step for the whole batch) and the
validator (one draw for every position of a group's completions) call the same function.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import blake3
import numpy as np
import torch

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_MIX_1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX_2 = np.uint64(0x94D049BB133111EB)
_TOP_53 = np.uint64(11)


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

    def stream_seed(self) -> int:
        """The completion's 64-bit noise stream seed (every position's noise derives from it)."""
        material = f"gumbel-v2\x00{self.run}\x00{self.worker}\x00{self.step}\x00{self.task_index}\x00{self.sample}"
        return int.from_bytes(blake3.blake3(material.encode()).digest()[:8], "little")


def stream_seeds(keys: Sequence[SamplingKey]) -> np.ndarray:
    """The stream seeds of `keys` as uint64 [len(keys)]; a decoder computes them once per batch."""
    return np.array([k.stream_seed() for k in keys], dtype=np.uint64)


def _splitmix64(seeds: np.ndarray, counters: np.ndarray) -> np.ndarray:
    """SplitMix64's output number `counter` of the stream seeded `seed` (broadcast, wrapping uint64)."""
    z = seeds + (counters + np.uint64(1)) * _GOLDEN
    z = (z ^ (z >> np.uint64(30))) * _MIX_1
    z = (z ^ (z >> np.uint64(27))) * _MIX_2
    return z ^ (z >> np.uint64(31))


def gumbel_noise_at(seeds: np.ndarray, positions: Sequence[int] | np.ndarray, vocab_size: int) -> torch.Tensor:
    """Noise rows for stream seeds [N] at positions [N]: Gumbel(0, 1), float32 [N, vocab_size], on the CPU."""
    seeds = np.asarray(seeds, dtype=np.uint64).reshape(-1)
    row_seeds = _splitmix64(seeds, np.asarray(positions, dtype=np.uint64).reshape(-1))
    bits = _splitmix64(row_seeds[:, None], np.arange(vocab_size, dtype=np.uint64)[None, :])
    uniform = ((bits >> _TOP_53).astype(np.float64) + 0.5) * 2.0**-53  # in [2^-54, 1 - 2^-54]
    exponential = (-np.log(uniform)).astype(np.float32)  # >= 2^-54: float32 keeps 24 bits of it, as the result
    return torch.from_numpy(-np.log(exponential))


def gumbel_noise(key: SamplingKey, position: int, vocab_size: int) -> torch.Tensor:
    """Gumbel(0, 1) noise of shape [vocab_size], float32, on the CPU; identical on every machine."""
    return gumbel_noise_at(stream_seeds([key]), [position], vocab_size)[0]


def gumbel_noise_batch(keys: Sequence[SamplingKey], positions: Sequence[int], vocab_size: int) -> torch.Tensor:
    """Noise for a decoding batch: row i belongs to keys[i] at positions[i]. Shape [len(keys), vocab_size]."""
    return gumbel_noise_at(stream_seeds(keys), positions, vocab_size)


def completion_noise(key: SamplingKey, length: int, vocab_size: int) -> torch.Tensor:
    """The noise of positions 0..length-1 of one completion, [length, vocab_size], in one draw."""
    return gumbel_noise_at(np.full(length, key.stream_seed(), dtype=np.uint64), np.arange(length), vocab_size)


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
