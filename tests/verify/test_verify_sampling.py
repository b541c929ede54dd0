"""The counter-based Gumbel noise: its distribution, its independence across streams and positions, and its
agreement between the decoder's per-step draws and the validator's per-completion draw."""

from __future__ import annotations

import math

import numpy as np
import torch

from verify import sampling
from verify.sampling import (
    SamplingKey,
    completion_noise,
    gumbel_noise,
    gumbel_noise_at,
    gumbel_noise_batch,
    stream_seeds,
)


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
    assert torch.equal(
        gumbel_noise_at(seeds[[2, 2]], [4, 9], 97), torch.stack([per_completion[2][4], per_completion[2][9]])
    )


def test_the_noise_stream_is_pinned():
    """The noise is versioned ("gumbel-v2"): a change to the hash, the counters or the transform must be a new
    version, not a silent drift that makes every validator reject every worker of the older release."""
    key = SamplingKey("run", "w", 3, 7, 1)
    assert key.stream_seed() == 0xA37E46E32FD24CBE
    drawn = gumbel_noise(key, 5, 1000)
    first_release = [-0.004666153807193041, 2.059312105178833, 1.55149507522583, 0.9195906519889832]
    # tolerance: one float32 ulp near 2, the most a different vectorised log may move a value
    assert torch.allclose(drawn[:4], torch.tensor(first_release), rtol=0, atol=2.5e-7)
    assert abs(float(drawn[999]) - 0.08257195353507996) < 1e-8


def test_cpu_blocks_and_the_device_path_draw_the_same_noise():
    """The CPU draw works in cache-sized blocks (rows and, for large vocabularies, columns); the accelerator path
    is one torch expression. Both must give every row exactly what it gets when drawn alone."""
    keys = [SamplingKey("run", f"w{i}", 1, i, 0) for i in range(3)]
    seeds, positions = np.repeat(stream_seeds(keys), 7), np.tile(np.arange(7), 3)
    for vocab in (3, 384, sampling._BLOCK_ELEMENTS + 17, 2 * sampling._BLOCK_ELEMENTS + 5):
        batch = gumbel_noise_at(seeds, positions, vocab)
        alone = torch.cat([gumbel_noise_at(seeds[i : i + 1], positions[i : i + 1], vocab) for i in range(len(seeds))])
        row_seeds = sampling._splitmix64(seeds, positions.astype(np.uint64))
        assert torch.equal(batch, alone)
        assert torch.equal(batch, sampling._noise_torch(row_seeds, vocab, torch.device("cpu")))
    assert gumbel_noise_at(seeds[:0], positions[:0], 384).shape == (0, 384)


def test_the_draw_equals_its_textbook_definition_up_to_a_log_ulp():
    """verify.testing writes the noise as its definition reads (whole arrays, numpy's logs); the blocked draw may
    differ from it only by one float32 ulp of the final log, never in which integers it hashed."""
    from verify.testing import textbook_gumbel_noise

    seeds = stream_seeds([SamplingKey("run", "w", 2, i, i % 3) for i in range(5)]).repeat(9)
    positions = np.tile(np.arange(9), 5)
    for vocab in (7, 384, sampling._BLOCK_ELEMENTS + 3):
        drawn, textbook = gumbel_noise_at(seeds, positions, vocab), textbook_gumbel_noise(seeds, positions, vocab)
        ulp = torch.finfo(torch.float32).eps * textbook.abs().clamp(min=2.0**-126)
        assert bool(((drawn - textbook).abs() <= ulp + 1e-7).all())
        assert float((drawn == textbook).double().mean()) > 0.5
