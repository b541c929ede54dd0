"""The CLI skeleton, the shared task assignment and the seeded sampler: contracts every package relies on."""

import subprocess
import sys

import pytest
import torch

from tasks.assignment import assign_tasks, is_assigned
from verify.sampling import SamplingKey, gumbel_noise, sample_tokens


def test_help_does_not_import_torch():
    code = ("import sys; from swarm.cli.main import main\ntry:\n main(['--help'])\nexcept SystemExit: pass\n"
            "print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip().splitlines()[-1] == "False"


def test_assignment_is_deterministic_distinct_and_worker_specific():
    eligible = list(range(100))
    a = assign_tasks("run", "w1", 3, eligible, 10)
    assert a == assign_tasks("run", "w1", 3, eligible, 10)
    assert len(set(a)) == 10 and set(a) <= set(eligible)
    assert a != assign_tasks("run", "w2", 3, eligible, 10)
    assert a != assign_tasks("run", "w1", 4, eligible, 10)
    assert all(is_assigned("run", "w1", 3, eligible, 10, i) for i in a)
    assert not any(is_assigned("run", "w1", 3, eligible, 10, i) for i in set(eligible) - set(a))


def test_assignment_wraps_when_more_picks_than_prompts():
    picks = assign_tasks("r", "w", 0, [5, 6, 7], 7)
    assert len(picks) == 7 and set(picks) == {5, 6, 7}
    assert sorted(picks[:3]) == [5, 6, 7] and sorted(picks[3:6]) == [5, 6, 7]


def test_gumbel_noise_is_reproducible_and_position_specific():
    key = SamplingKey("run", "w", 1, 42, 0)
    assert torch.equal(gumbel_noise(key, 5, 1000), gumbel_noise(key, 5, 1000))
    assert not torch.equal(gumbel_noise(key, 5, 1000), gumbel_noise(key, 6, 1000))
    assert not torch.equal(gumbel_noise(key, 5, 1000), gumbel_noise(SamplingKey("run", "w", 1, 42, 1), 5, 1000))


def test_gumbel_max_samples_from_the_softmax():
    logits = torch.tensor([[0.0, 1.0, 2.0, -1.0]])
    probs = torch.softmax(logits / 0.7, dim=-1)[0]
    counts = torch.zeros(4)
    n = 4000
    for i in range(n):
        tok, lp = sample_tokens(logits, gumbel_noise(SamplingKey("r", "w", 0, 0, i), 0, 4).unsqueeze(0), 0.7)
        counts[tok] += 1
        assert lp.item() == pytest.approx(torch.log(probs[tok]).item(), abs=1e-5)
    # 4000 draws: each frequency lies within 4 standard deviations of its probability
    sd = (probs * (1 - probs) / n).sqrt()
    assert ((counts / n - probs).abs() < 4 * sd + 1e-3).all()
