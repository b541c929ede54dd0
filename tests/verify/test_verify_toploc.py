"""TOPLOC: the vectorised polynomial code against a naive pure-Python reference, proof layout and round trips."""

from __future__ import annotations

import random
import struct

import numpy as np
import pytest
import torch

from verify import ndd, toploc

P = ndd.PRIME


# ---- naive reference: plain modular arithmetic, one element at a time, written straight from the definitions ----

def naive_interpolate(xs: list[int], ys: list[int]) -> list[int]:
    """Lagrange interpolation mod p, expanded into ascending coefficients (independent of Newton's method)."""
    n = len(xs)
    coeffs = [0] * n
    for i in range(n):
        basis, denom = [1], 1
        for j in range(n):
            if j != i:
                basis = [(a - xs[j] * b) % P for a, b in zip([0] + basis, basis + [0])]
                denom = denom * (xs[i] - xs[j]) % P
        scale = ys[i] * pow(denom, P - 2, P) % P
        coeffs = [(c + scale * b) % P for c, b in zip(coeffs, basis)]
    return coeffs


def naive_evaluate(coeffs: list[int], x: int) -> int:
    return sum(c * pow(x, k, P) for k, c in enumerate(coeffs)) % P


def naive_modulus(indices: list[int]) -> int:
    for m in range(P, 0, -1):
        if len({i % m for i in indices}) == len(indices):
            return m
    raise AssertionError("no modulus")


def naive_proof(hidden: torch.Tensor) -> bytes:
    """The reference byte layout, one chunk at a time with Python lists."""
    out = b""
    h = hidden.to(torch.bfloat16)
    for start in range(0, h.shape[0], 32):
        flat = h[start : start + 32].reshape(-1)
        k = min(128, flat.numel())
        idx = flat.abs().topk(k).indices.tolist()
        bits = [int(v) & 0xFFFF for v in flat[idx].view(torch.int16).tolist()]
        m = naive_modulus(idx)
        coeffs = naive_interpolate([i % m for i in idx], [b % P for b in bits]) + [0] * (128 - k)
        out += struct.pack(">H", m) + b"".join(struct.pack(">H", c) for c in coeffs)
    return out


# ---- tests ----

def test_interpolation_matches_naive_lagrange_and_passes_through_points():
    rng = random.Random(7)
    rows = [rng.sample(range(P), 40) for _ in range(3)]
    ys = [[rng.randrange(65536) for _ in range(40)] for _ in range(3)]
    got = ndd.interpolate(np.array(rows), np.array(ys))
    for r in range(3):
        assert got[r].tolist() == naive_interpolate(rows[r], [y % P for y in ys[r]])
        values = ndd.evaluate(got[r : r + 1], np.array([rows[r]]))[0].tolist()
        assert values == [y % P for y in ys[r]]
        assert values[:5] == [naive_evaluate(got[r].tolist(), x) for x in rows[r][:5]]


@pytest.mark.parametrize("k", [1, 5, 8, 9, 64, 100, 128])
def test_every_interpolation_path_matches_naive_lagrange(k):
    """Divided differences below 8 points, the product-tree Lagrange path from 8 (k a power of two or padded),
    points that include 0 and the largest residue, and a chunk of points bunched at the top of the field."""
    rng = random.Random(k)
    rows = [rng.sample(range(P), k) for _ in range(3)]
    rows[0][0] = 0
    rows[1][-1] = P - 1
    rows.append(list(range(P - k, P)))
    ys = [[rng.randrange(65536) for _ in range(k)] for _ in rows]
    got = ndd.interpolate(np.array(rows), np.array(ys))
    for r, (xs, row_ys) in enumerate(zip(rows, ys)):
        assert got[r].tolist() == naive_interpolate(xs, [y % P for y in row_ys])


def test_a_suspect_fft_falls_back_to_divided_differences(monkeypatch):
    """The guard: an FFT product that is not near an integer sends the batch to the exact integer method."""
    rng = np.random.default_rng(5)
    x = np.stack([rng.choice(P, 128, replace=False) for _ in range(4)])
    y = rng.integers(0, 65536, (4, 128))
    expected = ndd.interpolate(x, y)
    real_ifft = np.fft.irfft
    monkeypatch.setattr(np.fft, "irfft", lambda *a, **kw: real_ifft(*a, **kw) + 0.7)
    assert (ndd.interpolate(x, y) == expected).all()


def test_injective_modulus_is_the_largest_like_the_naive_search():
    rng = random.Random(3)
    # indices spread over a 32 x 5120 chunk collide modulo the prime often enough to exercise the search
    rows = [rng.sample(range(32 * 5120), 128) for _ in range(40)]
    got = ndd.injective_moduli(np.array(rows)).tolist()
    assert got == [naive_modulus(r) for r in rows]
    assert any(m < P for m in got)


@pytest.mark.parametrize("tokens,width", [(32, 128), (70, 96), (5, 64), (1, 64)])
def test_proof_bytes_equal_the_naive_reference_layout(tokens, width):
    torch.manual_seed(tokens * width)
    hidden = torch.randn(tokens, width) * 3
    proof = toploc.build_proof(hidden)
    assert len(proof) == toploc.proof_size(tokens) == 258 * -(-tokens // 32)
    assert proof == naive_proof(hidden)


def test_proof_round_trip_and_batched_build_agree():
    torch.manual_seed(1)
    hiddens = [torch.randn(t, 128, dtype=torch.bfloat16) for t in (1, 31, 32, 33, 100)]
    proofs = toploc.build_proofs(hiddens)
    assert proofs == [toploc.build_proof(h) for h in hiddens] == [naive_proof(h) for h in hiddens]
    for proof, hidden in zip(proofs, hiddens):
        result = toploc.verify_proof(proof, hidden)
        assert result.ok, result.reason
        assert all(s.exp_mismatches == 0 and s.mant_err_mean == 0 for s in result.stats)


def test_small_noise_passes_and_other_activations_fail():
    torch.manual_seed(2)
    hidden = torch.randn(64, 128)
    proof = toploc.build_proof(hidden)
    noisy = hidden * (1 + 1e-3 * torch.randn_like(hidden))
    assert toploc.verify_proof(proof, noisy).ok
    other = toploc.verify_proof(proof, torch.randn(64, 128))
    assert not other.ok and "exponents match" in other.reason
    scaled = toploc.verify_proof(proof, hidden * 1.2)  # same top-k positions, every mantissa shifted
    assert not scaled.ok and "mantissa" in scaled.reason


def test_strict_config_thresholds_are_applied():
    torch.manual_seed(4)
    hidden = torch.randn(32, 128)
    proof = toploc.build_proof(hidden)
    noisy = hidden * (1 + 2e-2 * torch.randn_like(hidden))
    loose = toploc.verify_proof(proof, noisy)
    strict = toploc.verify_proof(proof, noisy, toploc.ToplocConfig(max_mant_err_mean=0.01))
    assert loose.ok and not strict.ok


@pytest.mark.parametrize("mutate", [
    lambda p: p[:-1], lambda p: p + b"\0", lambda p: b"", lambda p: b"\0\0" + p[2:],
    lambda p: b"\xff\xff" + p[2:], lambda p: p[:2] + b"\xff\xff" + p[4:], lambda p: p[:2] + bytes(256),
])
def test_hostile_proofs_are_rejected_without_raising(mutate):
    torch.manual_seed(5)
    hidden = torch.randn(32, 128)
    result = toploc.verify_proof(mutate(toploc.build_proof(hidden)), hidden)
    assert not result.ok and result.reason


def test_wrong_hidden_shape_is_a_rejection_not_an_exception():
    assert not toploc.verify_proof(b"", torch.zeros(3)).ok
    assert toploc.verify_proof(b"", torch.zeros(0, 8)).ok


def test_batched_verification_equals_one_by_one():
    torch.manual_seed(6)
    hiddens = [torch.randn(t, 64) for t in (3, 40, 64, 1)]
    proofs = toploc.build_proofs(hiddens)
    proofs[1] = proofs[1][:-2]  # truncated
    proofs[2] = proofs[3] + proofs[3]  # right size, wrong content
    batched = toploc.verify_proofs(proofs, hiddens)
    assert batched == [toploc.verify_proof(p, h) for p, h in zip(proofs, hiddens)]
    assert [r.ok for r in batched] == [True, False, False, True]


@pytest.mark.parametrize("seed,tokens,width,digest", [
    (11, 70, 576, "ac73330e92295c1c49a2ed2bcc33bade91bc3cc043a2bb7dffa02fbe336cfb23"),
    (12, 40, 5120, "5309a179a343cd96145b1e9e2afbe61581c28a3bf76841e6e9b576a21b19dbd5"),
])
def test_proofs_are_byte_identical_to_the_reference_toploc_package(seed, tokens, width, digest):
    """Digests of the proofs `toploc` 0.1.6 itself built (build_proofs_bytes, decode_batching_size=32, topk=128,
    skip_prefill=True) for these seeded inputs; width 5120 exercises the modulus search below 65497."""
    import blake3

    generator = torch.Generator().manual_seed(seed)
    hidden = (torch.randn(tokens, width, generator=generator) * 2).to(torch.bfloat16)
    assert blake3.blake3(toploc.build_proof(hidden)).hexdigest() == digest
