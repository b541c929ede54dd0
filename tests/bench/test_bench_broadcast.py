"""`swarm bench broadcast` end to end on a tiny policy: real processes, both phases, every reported figure sane."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path


def log_tails(work: Path, chars: int = 1500) -> str:
    """The end of every process log the bench wrote: what a failed run waited on is in them."""
    logs = sorted(work.glob("*.log"))
    return "\n".join(f"--- {log.name}\n{log.read_text(errors='replace')[-chars:]}" for log in logs)


def test_a_tiny_broadcast_reports_every_figure_and_verifies_every_copy(tmp_path):
    # the bench's own limits (warm-up, then each wait of a phase) end a stuck run with the event it waited for,
    # well before the test's; the process logs then say why
    out = subprocess.run([sys.executable, "-m", "swarm", "bench", "broadcast", "--peers", "2", "--size-mb", "2",
                          "--upload-mbps", "200", "--seed-upload-mbps", "200", "--warmup", "30", "--timeout", "60",
                          "--json", "--work-dir", str(tmp_path / "work")], capture_output=True, text=True, timeout=400)
    assert out.returncode == 0, out.stderr[-2000:] + log_tails(tmp_path / "work")
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
    for cpu in (result["cpu_swarm"], result["cpu_single_origin"]):  # CPU is counted in 10 ms ticks: one process's
        assert cpu["cpu_s"] > 0  # share of a tiny run may read 0, all of them together do not
        assert min(cpu["peer_ms_per_mib"], cpu["seed_ms_per_mib"], cpu["idle_cpu_s_per_s"],
                   cpu["piece_path_ms_per_mib"]) >= 0


class _ReusingKernel:
    """Loopback sockets whose port 0 binds the lowest port not bound now, as a kernel may: a port probed and closed
    is handed out again at once."""

    bound: set[int] = set()

    def __init__(self, *args):
        self.port = None

    def bind(self, address):
        self.port = min(set(range(40000, 40100)) - self.bound)
        self.bound.add(self.port)

    def getsockname(self):
        return ("127.0.0.1", self.port)

    def close(self):
        self.bound.discard(self.port)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def test_every_process_of_a_broadcast_gets_its_own_port_even_where_probed_ports_come_back_at_once(tmp_path,
                                                                                                  monkeypatch):
    """Chosen one probe after another, each closed before the next, the ports of a broadcast's processes may repeat
    (a kernel picks the port just freed, or by chance): the processes sharing one fail to listen."""
    from swarm.bench import broadcast, local_ports

    monkeypatch.setattr(local_ports.socket, "socket", _ReusingKernel)
    ports = local_ports.free_ports(7)
    assert len(set(ports)) == 7
    seed = f"/ip4/127.0.0.1/tcp/{ports[0]}/p2p/seed"
    argvs = broadcast._peer_argvs(tmp_path, broadcast.PeerArgs(10.0), "swarm", "ab" * 32, seed, True, ports[1:])
    listens = [argv[argv.index("--listen") + 1] for argv in argvs]
    assert listens == [f"/ip4/127.0.0.1/tcp/{port}" for port in ports[1:]]
