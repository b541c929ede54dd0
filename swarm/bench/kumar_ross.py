"""The physical lower bound on distributing one file from a seed to N peers (Kumar and Ross, 2006).

    T_min = max(F / U, F / d_min, N * F / (U + N * u))

F bytes, seed upload U, peer upload u (all peers equal here), slowest peer download d_min. The first term: the
seed must send every byte at least once; the second: the slowest peer must receive every byte; the third: N*F
bytes must be delivered in total and only U + N*u bytes per second can be uploaded. Benchmarks report the measured
time over this bound.
"""

from __future__ import annotations

import math


def min_distribution_time(file_bytes: float, seed_upload: float, peer_upload: float, num_peers: int,
                          peer_download: float = math.inf) -> float:
    """Seconds to get `file_bytes` from one seed to `num_peers` peers, at best (rates in bytes per second)."""
    if file_bytes < 0 or num_peers < 1 or seed_upload <= 0 or peer_upload < 0 or peer_download <= 0:
        raise ValueError("sizes and rates must be positive and there must be at least one peer")
    return max(file_bytes / seed_upload, file_bytes / peer_download,
               num_peers * file_bytes / (seed_upload + num_peers * peer_upload))
