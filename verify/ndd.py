"""Polynomial arithmetic modulo the prime 65497 for TOPLOC proofs, vectorised over many chunks at once.

Why this shape: a proof commits 128 (index, bf16 bits) points per 32-token chunk as the coefficients of the unique
degree-127 polynomial through them, so a validator can evaluate it at *its own* top-k indices. The arithmetic
matches the reference `toploc` 0.1.6 (ndd.cpp): y values reduced mod p, coefficients in ascending order (c0 first);
the interpolating polynomial is unique, so any exact method gives the reference's bytes.

Why not Newton's divided differences (the reference's method, kept here as the fallback): in numpy it is 2k
dependent steps of a few calls each, about 8 ms of pure call overhead per batch, which made proof building 4-5 %
of the tiny model's generation. `interpolate` instead uses Lagrange's formula in a form made of a few large
operations (see its docstring), all in float64, which is exact here because every value is an integer below 2^40:
residues are below 2^16, so a product is below 2^32 and a sum of at most 128 products below 2^39. The longer
convolutions use float FFTs: for vectors a, b of residues the rounding error of an FFT product of size N = 2^m is at
most ||a||_2 ||b||_2 (about 13 m) 2^-53 (Brent, Percival and Zimmermann's bound), below 0.01 here (||a||_2 <= sqrt(128)
x 65497, m <= 8), so rounding to the nearest integer gives the exact product. As a guard against a broken FFT
library, every FFT output must lie within 1/8 of an integer, else the batch is redone by divided differences.
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

    Lagrange: f = sum_i v_i M(X) / (X - x_i) with M = prod_j (X - x_j) and v_i = y_i / M'(x_i). Written out,
    coefficient c_m = sum_s M_{m+1+s} z_s with z_s = sum_i v_i x_i^s, so the work is: M by a product tree of
    pairwise polynomial products (log2 k levels), M'(x_i) and z as matrix products with the chunk's power tables
    (`_Powers`), and c as one correlation of M with z. Divided differences (`_newton`) take over for fewer than
    8 or more than 128 points per chunk (the exactness argument above assumes at most 128) and when the FFT guard
    fires.
    """
    x = np.asarray(x, dtype=np.int64) % PRIME
    y = np.asarray(y, dtype=np.int64) % PRIME
    if x.ndim != 2 or x.shape != y.shape or x.shape[1] == 0:
        raise ValueError("x and y must be matching non-empty [chunks, k] arrays")
    if not _LAGRANGE_FROM <= x.shape[1] <= _LAGRANGE_UP_TO:
        return _newton(x, y)
    try:
        return _lagrange(x.astype(np.float64), y.astype(np.float64)).astype(np.int64)
    except _InexactFFT:
        return _newton(x, y)


def _lagrange(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    k = x.shape[1]
    powers = _Powers(x, k)
    master = _master_polynomial(x)  # [C, k + 1], ascending, monic
    derivative = _reduce(master[:, 1:] * np.arange(1, k + 1, dtype=np.float64))  # M' coefficients, [C, k]
    weights = _inverse_table_f64()[powers.evaluate(derivative).astype(np.int64)]  # 1 / M'(x_i)
    z = powers.weighted_power_sums(_reduce(weights * y))  # [C, k]
    return _correlate(master[:, 1:], z)


def _newton(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """interpolate by Newton's divided differences: the reference's algorithm, exact in integer arithmetic; used
    for very small k and as the fallback of the fast path. x, y: int64 residues [C, k].

    Step 1, divided differences in place: dd[:, i] <- (dd[:, i] - dd[:, i-1]) / (x[:, i] - x[:, i-j]) for i >= j.
    Step 2, expansion to standard form from the top: P <- P * (X - x_i) + dd_i, touching only the degree so far.
    Numpy's cost here is per element of a few large calls, so every chunk of a batch shares the same 2k vectorised
    steps, and the arithmetic runs in uint32: residues are below 2^16, a product of two below p^2 < 2^32, and
    uint32 floor division by the constant p is several times cheaper than int64 remainder (the dominant cost).
    """
    x, dd = x.astype(np.uint32), y.astype(np.uint32)
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
_LAGRANGE_FROM = 8  # below this many points per chunk divided differences take fewer numpy calls
_LAGRANGE_UP_TO = 128  # the float64 exactness bounds (module docstring) are worked out for at most 128 points
_POWER_BLOCK = 16  # x^s = x^(s mod 16) * (x^16)^(s // 16): two small power tables instead of one k x k table
_P64 = float(PRIME)
_INV_P = 1.0 / PRIME
_HALF_STEP = 0.5 / PRIME


def _reduce(a: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """a mod p for float64 arrays of exact non-negative integers below 2^40, into `out` or a new array.

    floor(a / p) is computed as floor(a * (1/p) + 1/(2p)): a / p = n + r / p with r <= p - 1, so adding 1/(2p)
    never reaches n + 1, and the computed product's error (below 2^-28 for such a) is far smaller than the 1/(2p)
    margin on either side, so the quotient is exact. About 5x cheaper than np.fmod.
    """
    q = a * _INV_P
    q += _HALF_STEP
    np.floor(q, out=q)
    q *= _P64
    return np.subtract(a, q, out=q if out is None else out)


@functools.lru_cache(maxsize=1)
def _inverse_table_f64() -> np.ndarray:
    return inverse_table().astype(np.float64)


class _Powers:
    """Power tables of each chunk's points, for evaluating polynomials at them and for power sums, as matrix
    products: low[c, a, i] = x_i^a (a < 16) and high[c, b, i] = x_i^(16 b), so x_i^(16 b + a) = low * high."""

    def __init__(self, x: np.ndarray, degree_bound: int) -> None:
        self.blocks = 1 << max(0, (-(-degree_bound // _POWER_BLOCK) - 1).bit_length())  # a power of two
        self.low, x16 = _power_table(x, _POWER_BLOCK)
        self.high, _ = _power_table(x16, self.blocks)

    def _blocked(self, coeffs: np.ndarray) -> np.ndarray:
        """[C, n] coefficients as [C, blocks, 16] (zero-padded): entry (b, a) is the coefficient of x^(16 b + a)."""
        padded = np.zeros((coeffs.shape[0], self.blocks * _POWER_BLOCK))
        padded[:, : coeffs.shape[1]] = coeffs
        return padded.reshape(coeffs.shape[0], self.blocks, _POWER_BLOCK)

    def evaluate(self, coeffs: np.ndarray) -> np.ndarray:
        """Each chunk's polynomial (ascending residues [C, n], n <= 16 * blocks) at its own points: [C, k]."""
        partial = _reduce(self._blocked(coeffs) @ self.low)  # [C, blocks, k]: sum over a of c_(16b+a) x^a
        return _reduce((partial * self.high).sum(axis=1))

    def weighted_power_sums(self, v: np.ndarray) -> np.ndarray:
        """z[c, s] = sum_i v[c, i] x_i^s mod p for s < k, v: residues [C, k]."""
        chunks, k = v.shape
        scaled = _reduce(self.high * v[:, None, :])  # [C, blocks, k]
        sums = _reduce(scaled @ self.low.transpose(0, 2, 1))  # [C, blocks, 16]
        return sums.reshape(chunks, -1)[:, :k]


def _power_table(x: np.ndarray, count: int) -> tuple[np.ndarray, np.ndarray]:
    """([C, count, k] with x^0 .. x^(count-1) mod p, x^count mod p), count a power of two, by doubling."""
    table = np.empty((x.shape[0], count, x.shape[1]))
    table[:, 0] = 1.0
    step, width = x, 1  # step = x^width
    while width < count:
        _reduce(table[:, :width] * step[:, None, :], out=table[:, width : 2 * width])
        step = _reduce(step * step)
        width *= 2
    return table, step


def _master_polynomial(x: np.ndarray) -> np.ndarray:
    """Ascending coefficients [C, k + 1] of prod_j (X - x_j) mod p, by a product tree of monic polynomials.

    A monic polynomial of degree n is kept as its n lower coefficients, so (X^n + A)(X^n + B) = X^2n + X^n (A + B)
    + A B needs one product A B of two length-n vectors per pair. k is padded to a power of two with factors X
    (points 0), which multiply the product by X^pad: its coefficients are then shifted by pad.
    """
    chunks, k = x.shape
    size = 1 << (k - 1).bit_length()
    # [coefficient, polynomial, chunk]: every operation below runs along the chunk axis, long and contiguous
    lower = np.zeros((1, size, chunks))
    lower[0, :k] = _reduce(_P64 - x.T)  # X - x_j has lower coefficient -x_j
    while lower.shape[1] > 1:
        a, b = lower[:, 0::2], lower[:, 1::2]
        n = a.shape[0]
        merged = np.zeros((2 * n,) + a.shape[1:])
        merged[: 2 * n - 1] = _convolve(a, b)
        merged[n:] += a + b
        lower = _reduce(merged)
    full = np.concatenate([lower[:, 0], np.ones((1, chunks))]).T  # [C, size + 1]
    return full[:, size - k :]


_DIRECT_UP_TO = 16  # polynomial products of at most this length run as n shifted multiply-adds, longer ones by FFT


class _InexactFFT(ArithmeticError):
    """An FFT product was not within 1/8 of an integer: impossible by the error bound unless the FFT is broken."""


def _convolve(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Exact products of the polynomials a, b [n, ...] (residues, coefficients first): [2n - 1, ...], not reduced.

    Short ones directly (one multiply-add per coefficient of a, each over the whole batch), longer ones by real FFT
    and rounding (exact: see the module docstring).
    """
    n = a.shape[0]
    if n <= _DIRECT_UP_TO:
        out = np.zeros((2 * n - 1,) + a.shape[1:])
        for i in range(n):
            out[i : i + n] += a[i] * b
        return out
    return _exact_fft_product(a, b, 2 * n, axis=0)[: 2 * n - 1]


def _exact_fft_product(a: np.ndarray, b: np.ndarray, fft_size: int, axis: int = -1) -> np.ndarray:
    """The cyclic convolution of size fft_size of residue vectors a, b (zero-padded), rounded to integers."""
    spectrum = np.fft.rfft(a, fft_size, axis=axis) * np.fft.rfft(b, fft_size, axis=axis)
    product = np.fft.irfft(spectrum, fft_size, axis=axis)
    rounded = np.rint(product)
    if np.abs(product - rounded).max(initial=0.0) > 0.125:
        raise _InexactFFT("an FFT product is not close to an integer")
    return rounded


def _correlate(upper: np.ndarray, z: np.ndarray) -> np.ndarray:
    """c[:, m] = sum_s upper[:, m + s] * z[:, s] mod p (upper = M_1 .. M_k, z: [C, k]): residues [C, k]."""
    k = z.shape[1]
    full = _exact_fft_product(upper, z[:, ::-1], 1 << (2 * k - 1).bit_length())
    return _reduce(full[:, k - 1 : 2 * k - 1])


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
