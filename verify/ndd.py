"""Polynomial arithmetic modulo the prime 65497 for TOPLOC proofs, vectorised over many chunks at once.

Why this shape: a proof commits 128 (index, bf16 bits) points per 32-token chunk as the coefficients of the unique
degree-127 polynomial through them, so a validator can evaluate it at *its own* top-k indices. Interpolation is
Newton's divided differences (O(k^2)), done here as k vectorised numpy steps over a [chunks, k] array, never as a
per-element Python loop. Residues are below 2^16 and every product below 65497^2 < 2^32, so the inner loops run in
uint32 (the int64 remainder was the dominant cost); results are returned as int64.

The arithmetic matches the reference `toploc` 0.1.6 (ndd.cpp): y values reduced mod p, coefficients in ascending
order (c0 first), evaluation by Horner's rule mod p.
"""

from __future__ import annotations

import functools

import numpy as np

PRIME = 65497
# The modulus search tries candidate moduli in growing vectorised blocks; almost every chunk succeeds at the first
# candidate (always when the chunk has fewer than 65497 entries), so the first block holds only the prime itself.
_MODULUS_BLOCKS = (1, 16, 256)


@functools.lru_cache(maxsize=1)
def inverse_table() -> np.ndarray:
    """inv[a] = a^(p-2) mod p for every residue a (inv[0] = 0), built once by vectorised square-and-multiply."""
    base = np.arange(PRIME, dtype=np.int64)
    result = np.ones(PRIME, dtype=np.int64)
    exponent = PRIME - 2
    while exponent:
        if exponent & 1:
            result = result * base % PRIME
        base = base * base % PRIME
        exponent >>= 1
    result[0] = 0
    return result


def interpolate(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Coefficients (ascending, int64) of the polynomials through points (x[c, i], y[c, i]) mod p; x: [C, k]
    distinct per row.

    Step 1, divided differences in place: dd[:, i] <- (dd[:, i] - dd[:, i-1]) / (x[:, i] - x[:, i-j]) for i >= j.
    Step 2, expansion to standard form from the top: P <- P * (X - x_i) + dd_i, touching only the degree so far.
    Numpy's cost here is per element of a few large calls, so every chunk of a batch shares the same 2k vectorised
    steps, and the arithmetic runs in uint32: residues are below 2^16, a product of two below p^2 < 2^32, and
    uint32 floor division by the constant p is several times cheaper than int64 remainder (the dominant cost).
    """
    x = (np.asarray(x, dtype=np.int64) % PRIME).astype(np.uint32)
    dd = (np.asarray(y, dtype=np.int64) % PRIME).astype(np.uint32)
    if x.ndim != 2 or x.shape != dd.shape or x.shape[1] == 0:
        raise ValueError("x and y must be matching non-empty [chunks, k] arrays")
    k = x.shape[1]
    inverse = _inverse_table_u32()
    for j in range(1, k):
        dd[:, j:] = _mul_mod(_sub_mod(dd[:, j:], dd[:, j - 1 : -1]), inverse[_sub_mod(x[:, j:], x[:, : k - j])])
    coeffs = np.zeros_like(dd)
    coeffs[:, 0] = dd[:, k - 1]
    for i in range(k - 2, -1, -1):
        degree = k - 1 - i  # degree of P after multiplying by (X - x_i)
        product = _mul_mod(x[:, i : i + 1], coeffs[:, :degree])
        coeffs[:, 1 : degree + 1] = coeffs[:, :degree]
        coeffs[:, 0] = dd[:, i]
        coeffs[:, :degree] = _sub_mod(coeffs[:, :degree], product)
    return coeffs.astype(np.int64)


_P32 = np.uint32(PRIME)


@functools.lru_cache(maxsize=1)
def _inverse_table_u32() -> np.ndarray:
    return inverse_table().astype(np.uint32)


def _sub_mod(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """(a - b) mod p for uint32 residues: the wrapped difference, or the difference plus p when that is smaller."""
    d = a - b
    return np.minimum(d, d + _P32)


def _mul_mod(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """(a * b) mod p for uint32 residues (the product fits: p^2 < 2^32)."""
    t = a * b
    return t - (t // _P32) * _P32


def evaluate(coeffs: np.ndarray, x: np.ndarray) -> np.ndarray:
    """Values (int64) of each row's polynomial (ascending coefficients [C, n]) at that row's points x [C, m], mod p.

    Horner's rule in uint32, as in interpolate: result * x + c stays below p^2 + p < 2^32 when c < p.
    """
    coeffs = (np.asarray(coeffs, dtype=np.int64) % PRIME).astype(np.uint32)
    x = (np.asarray(x, dtype=np.int64) % PRIME).astype(np.uint32)
    result = np.broadcast_to(coeffs[:, -1:], x.shape).copy()
    for i in range(coeffs.shape[1] - 2, -1, -1):
        t = result * x + coeffs[:, i : i + 1]
        result = t - (t // _P32) * _P32
    return result.astype(np.int64)


def injective_moduli(indices: np.ndarray) -> np.ndarray:
    """Per row, the largest m <= 65497 for which (index mod m) is injective over the row (as the reference picks it).

    Candidates are tried in descending blocks: sort each row's residues and look for equal neighbours.
    """
    indices = np.asarray(indices, dtype=np.int64)
    chunks, k = indices.shape
    found = np.zeros(chunks, dtype=np.int64)
    top, step = PRIME, 0
    while top >= max(k, 1) and (found == 0).any():
        todo = np.nonzero(found == 0)[0]
        block = _MODULUS_BLOCKS[min(step, len(_MODULUS_BLOCKS) - 1)]
        step += 1
        candidates = np.arange(top, max(top - block, k - 1), -1, dtype=np.int64)  # [M]
        residues = np.sort(indices[todo, None, :] % candidates[None, :, None], axis=-1)  # [R, M, k]
        injective = (np.diff(residues, axis=-1) != 0).all(axis=-1)  # [R, M]
        has_any = injective.any(axis=1)
        first = injective.argmax(axis=1)
        found[todo[has_any]] = candidates[first[has_any]]
        top = int(candidates[-1]) - 1
    if (found == 0).any():
        raise ValueError("no injective modulus exists for these indices")
    return found
