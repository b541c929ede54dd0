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
validator (one draw for every position of a group's completions) call the same function. It draws on the device
of the logits: on the CPU in cache-sized numpy blocks, elsewhere (a GPU decoder or validator) in torch's int64
arithmetic, which gives the same bits.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass

import blake3
import numpy as np
import torch

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_MIX_1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX_2 = np.uint64(0x94D049BB133111EB)
_TOP_53 = np.uint64(11)
_BLOCK_ELEMENTS = 1 << 15  # 256 KiB of uint64 per CPU block: the draw's buffers stay in cache


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


@functools.lru_cache(maxsize=8)
def _counter_offsets(vocab_size: int) -> np.ndarray:
    """(v + 1) * golden for v < vocab_size: the seed-independent half of SplitMix64's first step, per vocab size."""
    offsets = (np.arange(vocab_size, dtype=np.uint64) + np.uint64(1)) * _GOLDEN
    offsets.flags.writeable = False
    return offsets


@functools.lru_cache(maxsize=8)
def _counter_offsets_on(vocab_size: int, device: torch.device) -> torch.Tensor:
    """_counter_offsets as int64 (the same bits) on `device`."""
    return torch.from_numpy(_counter_offsets(vocab_size).view(np.int64).copy()).to(device)


def _noise_cpu(row_seeds: np.ndarray, vocab_size: int) -> torch.Tensor:
    """The noise of every row seed on the CPU, float32 [N, V], made in blocks of about _BLOCK_ELEMENTS.

    Why blocks: a whole [N, V] draw streams some fifteen [N, V] temporaries through memory; a block of a few hundred
    KiB stays in cache and its buffers are reused in place, which halves the cost per element.
    """
    out = torch.empty((len(row_seeds), vocab_size), dtype=torch.float32)
    offsets = _counter_offsets(vocab_size)
    cols = min(vocab_size, _BLOCK_ELEMENTS)
    rows = max(1, _BLOCK_ELEMENTS // cols)
    z, shifted, uniform = np.empty((rows, cols), np.uint64), np.empty((rows, cols), np.uint64), np.empty((rows, cols))
    for r0 in range(0, len(row_seeds), rows):
        for c0 in range(0, vocab_size, cols):
            seeds, cut = row_seeds[r0 : r0 + rows], offsets[c0 : c0 + cols]
            shape = (len(seeds), len(cut))
            block = _block_bits(seeds, cut, z[: shape[0], : shape[1]], shifted[: shape[0], : shape[1]])
            u = uniform[: shape[0], : shape[1]]
            np.add(block, 0.5, out=u)  # uint64 -> float64 is exact below 2^53
            np.multiply(u, 2.0**-53, out=u)  # in [2^-54, 1 - 2^-54]
            target = out[r0 : r0 + shape[0], c0 : c0 + shape[1]]
            target.copy_(torch.from_numpy(u).log_().neg_())  # -log(u) >= 2^-54, rounded to float32 as the result
            target.log_().neg_()
    return out


def _block_bits(seeds: np.ndarray, offsets: np.ndarray, z: np.ndarray, shifted: np.ndarray) -> np.ndarray:
    """The top 53 bits of SplitMix64's outputs for seeds [n] x counter offsets [m], written into z [n, m]."""
    np.add(seeds[:, None], offsets[None, :], out=z)
    for shift, multiplier in ((30, _MIX_1), (27, _MIX_2)):
        np.right_shift(z, np.uint64(shift), out=shifted)
        np.bitwise_xor(z, shifted, out=z)
        np.multiply(z, multiplier, out=z)
    np.right_shift(z, np.uint64(31), out=shifted)
    np.bitwise_xor(z, shifted, out=z)
    return np.right_shift(z, _TOP_53, out=z)


def _noise_torch(row_seeds: np.ndarray, vocab_size: int, device: torch.device) -> torch.Tensor:
    """_noise_cpu's noise made on `device` with torch's int64 arithmetic, which gives the same bits (products wrap,
    and a masked arithmetic shift is the logical one): a GPU decoder or validator draws its noise where its logits
    are instead of waiting on a CPU draw and a copy of [N, V] floats over the bus."""
    z = (
        torch.from_numpy(row_seeds.view(np.int64).copy()).to(device)[:, None]
        + _counter_offsets_on(vocab_size, device)[None, :]
    )
    for shift, multiplier in ((30, _MIX_1), (27, _MIX_2)):
        z = (z ^ _logical_shift(z, shift)) * int(np.array(multiplier).view(np.int64))
    bits = _logical_shift(z ^ _logical_shift(z, 31), int(_TOP_53))
    uniform = (bits.double() + 0.5) * 2.0**-53  # in [2^-54, 1 - 2^-54]; exact, as on the CPU
    return uniform.log_().neg_().float().log_().neg_()


def _logical_shift(z: torch.Tensor, shift: int) -> torch.Tensor:
    """z >> shift as if z were unsigned (torch shifts int64 arithmetically)."""
    return (z >> shift) & ((1 << (64 - shift)) - 1)


def gumbel_noise_at(seeds: np.ndarray, positions: Sequence[int] | np.ndarray, vocab_size: int,
                    device: torch.device | str | None = None) -> torch.Tensor:
    """Noise rows for stream seeds [N] at positions [N]: Gumbel(0, 1), float32 [N, vocab_size], made on `device`
    (the CPU by default; pass the logits' device so a GPU never waits on a CPU draw)."""
    seeds = np.asarray(seeds, dtype=np.uint64).reshape(-1)
    row_seeds = _splitmix64(seeds, np.asarray(positions, dtype=np.uint64).reshape(-1))
    device = torch.device(device if device is not None else "cpu")
    return _noise_cpu(row_seeds, vocab_size) if device.type == "cpu" else _noise_torch(row_seeds, vocab_size, device)


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
    return perturb_(logits.to(torch.float32, copy=True), noise, temperature)


def perturb_(scores: torch.Tensor, noise: torch.Tensor, temperature: float) -> torch.Tensor:
    """perturbed_scores computed in place in a float32 buffer of logits the caller owns: the same two roundings
    (divide, then add), so the same bits, without two more [T, V] buffers (a validator's logits are hundreds of MB,
    and fresh buffers of that size cost a page fault per 4 KiB)."""
    if temperature <= 0.0:
        return scores
    return scores.div_(temperature).add_(noise.to(scores.device))


def sample_tokens(logits: torch.Tensor, noise: torch.Tensor, temperature: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Sample one token per row. logits, noise: [B, V]. Returns (tokens [B] int64, sampling logprobs [B] float32).

    The logprob is that of the chosen token under softmax(logits / T), the distribution Gumbel-max samples from.
    """
    scores = perturbed_scores(logits, noise, temperature)
    tokens = scores.argmax(dim=-1)
    scaled = logits.float() / (temperature if temperature > 0 else 1.0)
    logprobs = torch.log_softmax(scaled, dim=-1).gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
    return tokens, logprobs
