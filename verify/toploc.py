"""TOPLOC proofs: commit a completion's last hidden states in 258 bytes per 32 tokens, check them by prefill.

What is committed: hidden[t] is the final-norm output (the LM head's input, HF `hidden_states[-1]`) at the position
whose logits sampled generated token t, i.e. prompt position P-1+t. That is exactly what a forward pre-hook on the
LM head (or vLLM's logits_processor) sees while decoding, and what a validator gets from one prefill of
prompt + completion; the last prompt position is included, so the proof also binds the prompt.

Byte layout, identical to the reference `toploc` 0.1.6 with decode_batching_size=32, topk=128, skip_prefill=True
(read from its ProofPoly.to_bytes / from_points and poly.py build_proofs): the generated tokens are cut into chunks
of 32 rows (the last chunk keeps the remainder); a chunk [n, H] is cast to bf16 and flattened row-major (flat index
= row * H + column); the top-128 entries by |value| give points (index mod m, bf16 bits as uint16), m the largest
modulus <= 65497 making index mod m injective; one proof per chunk is 2 bytes m then 128 coefficients (ascending
degree), every field big-endian uint16: 258 bytes. The proof of a completion is the concatenation of its chunks'.
A remainder chunk with fewer than 128 entries (only when H < 128) keeps all of them and pads the coefficients with
zeros, which leaves the polynomial unchanged; the reference would fail there.

Verification follows the reference: the validator takes its own top-k indices, evaluates the committed polynomial
there, and compares bf16 exponent bits (0x7F80) and mantissa bits (0x007F) with its own values; the median is the
upper median (element n//2 of the sorted errors), as in the reference's C++ path.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import torch

from verify import ndd

CHUNK_TOKENS = 32
TOPK = 128
PROOF_CHUNK_BYTES = 2 + 2 * TOPK
_EXP_MASK = 0x7F80
_MANT_MASK = 0x007F


@dataclass(frozen=True)
class ToplocConfig:
    """Acceptance thresholds; the defaults are the reference's (tuned for bf16 across GPUs and kernels).

    min_exp_matches: of 128 top-k entries, how many bf16 exponents must match (scaled down for a short last chunk).
    max_mant_err_mean / max_mant_err_median: bound on the mantissa error (in bf16 ulps) over exponent-matched entries.
    """

    min_exp_matches: int = 90
    max_mant_err_mean: float = 10.0
    max_mant_err_median: float = 8.0


# For validators that run the workers' exact float32 kernels (e.g. every peer on CPU torch): honest proofs then
# match with zero error whatever the batch layout, so far smaller deviations (1e-3 relative weight noise gives a
# mean mantissa error of about 0.2) reveal a different model. Never use it across GPUs or with bf16 inference.
FP32_SAME_KERNELS = ToplocConfig(min_exp_matches=124, max_mant_err_mean=0.05, max_mant_err_median=0.0)


@dataclass(frozen=True)
class ChunkStats:
    """The comparison of one 32-token chunk: exponent mismatches and mantissa error over matched exponents."""

    exp_mismatches: int
    mant_err_mean: float
    mant_err_median: float


@dataclass(frozen=True)
class ProofResult:
    """ok: every chunk passed; reason: the first failure in words ('' when ok); stats: one entry per chunk."""

    ok: bool
    reason: str
    stats: tuple[ChunkStats, ...] = field(default=())


def proof_size(num_tokens: int) -> int:
    """Bytes of a proof over `num_tokens` generated tokens: 258 per started chunk of 32."""
    return PROOF_CHUNK_BYTES * math.ceil(num_tokens / CHUNK_TOKENS)


def build_proof(hidden: torch.Tensor) -> bytes:
    """The proof over one completion's last hidden states, hidden: [T, H] (any float dtype, any device)."""
    return build_proofs([hidden])[0]


def build_proofs(hiddens: list[torch.Tensor]) -> list[bytes]:
    """Proofs for many completions at once: the top-k of every chunk of every completion is one torch call per
    chunk size and all chunks are interpolated in one vectorised pass (the cost is per call, not per chunk)."""
    chunk_lists = _chunk_topk_many(hiddens)
    flat = [c for chunks in chunk_lists for c in chunks]
    if not flat:
        return [b"" for _ in hiddens]
    coeffs, moduli = _commit(flat)
    fields = np.concatenate([moduli[:, None], coeffs], axis=1).astype(">u2")  # [chunks, 129]: one proof chunk a row
    out, start = [], 0
    for chunks in chunk_lists:
        out.append(fields[start : start + len(chunks)].tobytes())
        start += len(chunks)
    return out


def verify_proof(proof: bytes, hidden: torch.Tensor, config: ToplocConfig | None = None) -> ProofResult:
    """Check `proof` against the validator's own last hidden states [T, H] of the same completion; never raises."""
    return verify_proofs([proof], [hidden], config)[0]


def verify_proofs(
    proofs: list[bytes], hiddens: list[torch.Tensor], config: ToplocConfig | None = None
) -> list[ProofResult]:
    """verify_proof for many completions: one top-k per chunk size and every chunk's polynomial evaluated in one
    vectorised pass."""
    config = config or ToplocConfig()
    shaped = [_check_shape(bytes(p), h) for p, h in zip(proofs, hiddens)]
    ok_shape = [i for i, r in enumerate(shaped) if r is None]
    topks = dict(zip(ok_shape, _chunk_topk_many([hiddens[i] for i in ok_shape])))
    parsed: list[tuple[list, np.ndarray, np.ndarray] | ProofResult] = []
    for i, proof in enumerate(proofs):
        if shaped[i] is not None:
            parsed.append(shaped[i])
            continue
        try:
            parsed.append(_parse(bytes(proof), topks[i]))
        except Exception as exc:  # noqa: BLE001 - hostile input must yield a verdict, not a crash
            parsed.append(ProofResult(False, f"proof could not be checked ({type(exc).__name__}: {exc})"))
    pending = [p for p in parsed if not isinstance(p, ProofResult)]
    if pending:
        chunks = [c for p in pending for c in p[0]]
        stats = iter(_compare(np.concatenate([p[1] for p in pending]), np.concatenate([p[2] for p in pending]), chunks))
    results = []
    for p in parsed:
        results.append(p if isinstance(p, ProofResult) else _judge_all(p[0], [next(stats) for _ in p[0]], config))
    return results


def _check_shape(proof: bytes, hidden) -> ProofResult | None:
    """A rejecting ProofResult when the hidden states or the proof's length cannot match, else None."""
    if not isinstance(hidden, torch.Tensor) or hidden.ndim != 2:
        return ProofResult(False, "hidden states must be a [T, H] tensor")
    expected = proof_size(hidden.shape[0])
    if len(proof) != expected:
        return ProofResult(False, f"proof is {len(proof)} bytes, expected {expected} for {hidden.shape[0]} tokens")
    return None


def _parse(proof: bytes, chunks: list[tuple[np.ndarray, np.ndarray]]):
    """(chunks, moduli, coefficients) ready to compare, or a rejecting ProofResult."""
    moduli, coeffs = np.zeros(len(chunks), dtype=np.int64), np.zeros((len(chunks), TOPK), dtype=np.int64)
    for i, (indices, _) in enumerate(chunks):
        decoded = _decode_chunk(proof[i * PROOF_CHUNK_BYTES : (i + 1) * PROOF_CHUNK_BYTES])
        if isinstance(decoded, str):
            return ProofResult(False, f"chunk {i}: {decoded}")
        if decoded[0] < len(indices):
            return ProofResult(
                False, f"chunk {i}: modulus {decoded[0]} cannot be injective over {len(indices)} indices"
            )
        moduli[i], coeffs[i] = decoded
    return chunks, moduli, coeffs


def _judge_all(chunks, stats: list[ChunkStats], config: ToplocConfig) -> ProofResult:
    for i, (s, (indices, _)) in enumerate(zip(stats, chunks)):
        reason = _judge(s, len(indices), config)
        if reason:
            return ProofResult(False, f"chunk {i}: {reason}", tuple(stats))
    return ProofResult(True, "", tuple(stats))


def _chunk_topk(hidden: torch.Tensor) -> list[tuple[np.ndarray, np.ndarray]]:
    """Per chunk: (top-k flat indices int64, their bf16 bit patterns as int64 0..65535), in torch's top-k order."""
    return _chunk_topk_many([hidden])[0]


def _chunk_topk_many(hiddens: list[torch.Tensor]) -> list[list[tuple[np.ndarray, np.ndarray]]]:
    """_chunk_topk of every completion, with one bf16 cast and one top-k per distinct chunk size (full chunks of
    the same width share one; a short last chunk shares one with the last chunks of the same size)."""
    by_size: dict[int, list[tuple[int, torch.Tensor]]] = {}
    counts = []
    for n, hidden in enumerate(hiddens):
        if hidden.ndim != 2:
            raise ValueError(f"hidden states must be [T, H], got shape {tuple(hidden.shape)}")
        tokens, width = hidden.shape
        full = tokens // CHUNK_TOKENS
        if full:
            by_size.setdefault(CHUNK_TOKENS * width, []).append((n, hidden[: full * CHUNK_TOKENS].reshape(full, -1)))
        if tokens % CHUNK_TOKENS:
            by_size.setdefault((tokens % CHUNK_TOKENS) * width, []).append(
                (n, hidden[full * CHUNK_TOKENS :].reshape(1, -1))
            )
        counts.append(full + (1 if tokens % CHUNK_TOKENS else 0))
    out: list[list[tuple[np.ndarray, np.ndarray]]] = [[] for _ in hiddens]
    for size in sorted(by_size, reverse=True):  # full chunks first, so each completion's chunks stay in order
        blocks = by_size[size]
        rows = iter(_topk_rows(torch.cat([b.detach() for _, b in blocks]).to(torch.bfloat16), min(TOPK, size)))
        for n, block in blocks:
            out[n].extend(next(rows) for _ in range(block.shape[0]))
    return out


def _topk_rows(block: torch.Tensor, k: int) -> list[tuple[np.ndarray, np.ndarray]]:
    indices = block.abs().topk(k, dim=-1).indices
    values = block.gather(-1, indices).contiguous()
    bits = values.view(torch.int16).to(torch.int64).cpu().numpy() & 0xFFFF
    idx = indices.cpu().numpy().astype(np.int64)
    return [(idx[r], bits[r]) for r in range(idx.shape[0])]


def _commit(chunks: list[tuple[np.ndarray, np.ndarray]]) -> tuple[np.ndarray, np.ndarray]:
    """Interpolate every chunk; short chunks (fewer than 128 points) are done apart and zero-padded."""
    coeffs = np.zeros((len(chunks), TOPK), dtype=np.int64)
    moduli = np.zeros(len(chunks), dtype=np.int64)
    by_k: dict[int, list[int]] = {}
    for i, (indices, _) in enumerate(chunks):
        by_k.setdefault(len(indices), []).append(i)
    for k, rows in by_k.items():
        x = np.stack([chunks[i][0] for i in rows])
        y = np.stack([chunks[i][1] for i in rows])
        m = ndd.injective_moduli(x)
        coeffs[rows, :k] = ndd.interpolate(x % m[:, None], y)
        moduli[rows] = m
    return coeffs, moduli


def _decode_chunk(data: bytes) -> tuple[int, np.ndarray] | str:
    """(modulus, coefficients) or a reason string: a hostile proof may hold any bytes."""
    fields = np.frombuffer(data, dtype=">u2").astype(np.int64)
    modulus, coeffs = int(fields[0]), fields[1:]
    if modulus == 0:
        return "null proof (modulus 0)"
    if modulus > ndd.PRIME:
        return f"modulus {modulus} is above {ndd.PRIME}"
    if (coeffs >= ndd.PRIME).any():
        return "a coefficient is not reduced modulo 65497"
    return modulus, coeffs


def _compare(
    moduli: np.ndarray, coeffs: np.ndarray, chunks: list[tuple[np.ndarray, np.ndarray]]
) -> tuple[ChunkStats, ...]:
    """Evaluate every chunk's polynomial at the validator's indices in one vectorised pass, then score each chunk.

    A short last chunk is padded with index 0 and its padding masked out of the statistics.
    """
    if not chunks:
        return ()
    x = np.zeros((len(chunks), TOPK), dtype=np.int64)
    own = np.zeros((len(chunks), TOPK), dtype=np.int64)
    valid = np.zeros((len(chunks), TOPK), dtype=bool)
    for i, (indices, bits) in enumerate(chunks):
        x[i, : len(indices)], own[i, : len(indices)], valid[i, : len(indices)] = indices, bits, True
    committed = ndd.evaluate(coeffs, x % moduli[:, None])
    exp_match = (committed & _EXP_MASK) == (own & _EXP_MASK)
    mant_err = np.abs((committed & _MANT_MASK) - (own & _MANT_MASK))
    matched = exp_match & valid
    counts = matched.sum(axis=1)
    mismatches = (~exp_match & valid).sum(axis=1)
    means = (mant_err * matched).sum(axis=1) / np.maximum(counts, 1)
    medians = np.sort(np.where(matched, mant_err, np.iinfo(np.int64).max), axis=1)[np.arange(len(chunks)), counts // 2]
    none = float(2**64)  # no exponent matched: no mantissa to compare, worse than any threshold
    return tuple(ChunkStats(int(mismatches[i]), float(means[i]) if counts[i] else none,
                            float(medians[i]) if counts[i] else none) for i in range(len(chunks)))


def _judge(stats: ChunkStats, k: int, config: ToplocConfig) -> str:
    needed = math.ceil(config.min_exp_matches * k / TOPK)
    if k - stats.exp_mismatches < needed:
        return f"{k - stats.exp_mismatches} of {k} exponents match, {needed} needed"
    if stats.mant_err_mean > config.max_mant_err_mean:
        return f"mean mantissa error {stats.mant_err_mean:.2f} > {config.max_mant_err_mean}"
    if stats.mant_err_median > config.max_mant_err_median:
        return f"median mantissa error {stats.mant_err_median:.0f} > {config.max_mant_err_median}"
    return ""
