"""`swarm bench broadcast` end to end on a tiny policy: real processes, both phases, every reported figure sane."""

from __future__ import annotations

import json
import subprocess
import sys


def test_a_tiny_broadcast_reports_every_figure_and_verifies_every_copy(tmp_path):
    out = subprocess.run([sys.executable, "-m", "swarm", "bench", "broadcast", "--peers", "2", "--size-mb", "2",
                          "--upload-mbps", "200", "--seed-upload-mbps", "200", "--json", "--work-dir",
                          str(tmp_path / "work")], capture_output=True, text=True, timeout=240)
    assert out.returncode == 0, out.stderr[-2000:]
    result = json.loads(out.stdout)
    assert result["all_verified"] is True and result["warm_links"] == "3/3"
    file_mb = (tmp_path / "work" / "ckpt" / "model.safetensors").stat().st_size / 2**20
    # Kumar-Ross for F, U0 = u = 25 MB/s, N = 2: max(F/U0, 2F/(3 U0)) = F/U0
    assert abs(result["t_min_s"] - file_mb * 2**20 / 25e6) < 1e-3
    assert result["t_swarm_s"] > result["t_min_s"] and result["t_single_origin_s"] > result["t_min_s"]
    # the seed sent at least one full copy; together the peers served at most what the seed did not
    assert 1.0 <= result["seed_upload_ratio"] <= 2.0
    assert len(result["peer_upload_mb"]) == 2 and sum(result["peer_upload_mb"]) <= file_mb * 1.05
    assert 0 < result["peer_max_rss_mb"] < 300 and 0 < result["seed_rss_mb"] < 300
