"""`swarm bench transfer`: a real two-process run on loopback that verifies every byte, CPUs pinned or not."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest


def bench(*extra: str) -> dict:
    done = subprocess.run(
        [sys.executable, "-m", "swarm", "bench", "transfer", "--size-mb", "2", "--repeat", "1", "--json", *extra],
        capture_output=True, text=True, timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout)


@pytest.mark.parametrize("pin", [True, False])
def test_both_paths_move_every_byte_and_the_ratio_compares_their_medians(pin):
    result = bench() if pin else bench("--no-pin")
    assert result["verified"] is True  # each path's digest came back from the receiver and matched
    paths = ["p2p", "raw_tcp", "p2p_unframed", "raw_tcp_framed"]
    assert all(result[f"mib_s_{path}"] > 0 for path in paths)
    assert result["ratio"] == pytest.approx(result["mib_s_p2p"] / result["mib_s_raw_tcp"], abs=1e-3)
    for path in paths:  # each side's own CPU time per MiB: the receiver reports its share with the digest
        sides = result["cpu_ms_per_mib"][path]
        assert set(sides) == {"sender", "receiver"} and all(0 < ms < 1000 for ms in sides.values())
    if not pin or len(os.sched_getaffinity(0)) < 2:
        assert result["pinned_cpus"] is None
    else:  # sender and receiver on two different CPUs this process may use, as two peers' machines would be
        sender, receiver = result["pinned_cpus"]
        assert sender != receiver and {sender, receiver} <= os.sched_getaffinity(0)


def test_out_of_range_sizes_get_one_clear_line():
    done = subprocess.run([sys.executable, "-m", "swarm", "bench", "transfer", "--size-mb", "0"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "--size-mb must be between 1 and 16384, got 0" in done.stderr
    assert "Traceback" not in done.stderr
