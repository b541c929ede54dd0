"""Near-tie flips of one group: the evidence a validator's sampling check sees, counted in a fixed-size record.

A flip is a completion token that is not the validator's re-derived seeded sample (its perturbed score is below
the best one). One group may hold a few flips whose gap is within the sampling check's tolerance, because honest
kernels differ; a cheating worker hides in exactly that allowance, so the flips of every group are counted here
and a worker's sum is judged by verify/worker_history.py.

The gap histogram has fixed bins (GAP_EDGES, in perturbed-score units), so a record is a few integers whatever
the group's length: honest float32 flips sit in the lowest bins (kernel noise is ~1e-6 of a score), a worker
that chooses its tokens among near-ties spreads over the whole tolerance.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

GAP_EDGES = (1e-6, 1e-5, 1e-4, 1e-3, 5e-3, 1e-2, 2e-2, 5e-2, 0.5)
"""Upper edges of the gap bins; one more bin holds larger (or non-finite) gaps."""
_EDGES = np.array(GAP_EDGES, dtype=np.float32)


@dataclass(frozen=True)
class NearTies:
    """tokens: completion tokens re-derived; flips: tokens that are not the seeded sample (any gap above 0);
    gap_bins: flips per gap bin (len(GAP_EDGES) + 1): bin i holds gaps in (GAP_EDGES[i-1], GAP_EDGES[i]]."""

    tokens: int
    flips: int
    gap_bins: tuple[int, ...]

    def __add__(self, other: "NearTies") -> "NearTies":
        return NearTies(self.tokens + other.tokens, self.flips + other.flips,
                        tuple(a + b for a, b in zip(self.gap_bins, other.gap_bins)))


NO_NEAR_TIES = NearTies(0, 0, (0,) * (len(GAP_EDGES) + 1))


def count_near_ties(gaps: torch.Tensor) -> NearTies:
    """The record of one group from its per-token score gaps (best perturbed score minus the claimed token's)."""
    mask = ~(gaps <= 0)  # NaN counts as a flip, in the last bin
    if not bool(mask.any()):  # the common case costs one reduction
        return NearTies(int(gaps.numel()), 0, NO_NEAR_TIES.gap_bins)
    flipped = np.nan_to_num(gaps[mask].float().cpu().numpy(), nan=np.inf)
    counts = np.bincount(np.searchsorted(_EDGES, flipped, side="left"), minlength=len(GAP_EDGES) + 1)
    return NearTies(int(gaps.numel()), int(flipped.size), tuple(int(c) for c in counts))


def near_ties_of(verdict) -> NearTies | None:
    """The near-tie record of a verify.verifier.Verdict's sampling check (None when the group was never
    prefilled: it failed a cheap check, or its prefill or sampling check raised)."""
    for check in verdict.checks:
        if check.name == "sampling":
            return getattr(check, "near_ties", None)
    return None
