"""The counter-based Gumbel noise: its distribution, its independence across streams and positions, and its
agreement between the decoder's per-step draws and the validator's per-completion draw."""

from __future__ import annotations

import math

import numpy as np
import torch

from verify.sampling import SamplingKey, completion_noise, gumbel_noise_at, gumbel_noise_batch, stream_seeds


def test_noise_has_the_gumbel_moments_and_quantiles():
    g = completion_noise(SamplingKey("run", "w", 0, 7, 0), 64, 4096).double().flatten()  # 262144 draws
    n = g.numel()
    assert abs(float(g.mean()) - 0.5772156649) < 5 * math.sqrt(math.pi**2 / 6 / n)
    assert abs(float(g.var()) - math.pi**2 / 6) < 0.03
    for q in (0.01, 0.5, 0.99):  # Gumbel CDF exp(-exp(-x)) at its own quantiles
        x = -math.log(-math.log(q))
        assert abs(float((g <= x).double().mean()) - q) < 5 * math.sqrt(q * (1 - q) / n)
    assert bool(torch.isfinite(g).all())


def test_streams_and_positions_are_uncorrelated():
    keys = [SamplingKey("run", "w", 0, 7, s) for s in range(2)]
    a, b = completion_noise(keys[0], 32, 2048), completion_noise(keys[1], 32, 2048)
    for x, y in ((a, b), (a[:-1], a[1:]), (a[:, :-1], a[:, 1:])):
        r = float(torch.corrcoef(torch.stack([x.flatten(), y.flatten()]))[0, 1])
        assert abs(r) < 5 / math.sqrt(x.numel())


def test_a_decoding_batch_draws_the_same_rows_as_the_validator():
    keys = [SamplingKey("run", f"w{i}", 3, i, i % 4) for i in range(6)]
    per_completion = [completion_noise(k, 10, 97) for k in keys]
    for position in range(10):
        batch = gumbel_noise_batch(keys, [position] * len(keys), 97)
        assert all(torch.equal(batch[i], per_completion[i][position]) for i in range(len(keys)))
    seeds = stream_seeds(keys)
    assert seeds.dtype == np.uint64 and len(set(seeds.tolist())) == len(keys)
    assert torch.equal(gumbel_noise_at(seeds[[2, 2]], [4, 9], 97), torch.stack([per_completion[2][4], per_completion[2][9]]))
