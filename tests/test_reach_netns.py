"""Private peers over real network stacks (tests/netns.py): relayed when nothing else works, hole-punched behind NAT.

Each test builds its own namespaces, runs one public relay and three private peers as processes
(tests/netns_peer.py), and removes everything on exit. Needs root and nftables (install.sh installs it).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest

from swarm.netns import PUBLIC_IP, Testbed, available

pytestmark = pytest.mark.timeout(60)
PEER = str(Path(__file__).with_name("netns_peer.py"))
PRIVATE = 3


def _run(tmp_path: Path, nat: bool) -> dict[str, dict]:
    """Start the relay and the private peers, wait (bounded) for each peer's result, return them by name."""
    with Testbed(private=PRIVATE, nat=nat) as net:
        net.spawn(net.public, [sys.executable, PEER, "relay", PUBLIC_IP, str(tmp_path), "relay", "0"],
                  log=tmp_path / "relay.log")
        procs = [net.spawn(net.private_ns(i), [sys.executable, PEER, "private", net.private_ip(i), str(tmp_path),
                                               f"p{i}", str(PRIVATE)], log=tmp_path / f"p{i}.log")
                 for i in range(1, PRIVATE + 1)]
        deadline = time.monotonic() + 50
        for i, proc in enumerate(procs, start=1):
            proc.wait(max(1.0, deadline - time.monotonic()))
            assert proc.returncode == 0, (tmp_path / f"p{i}.log").read_text()[-3000:]
    return {f"p{i}": json.loads((tmp_path / f"p{i}.json").read_text()) for i in range(1, PRIVATE + 1)}


@pytest.fixture(autouse=True)
def _needs_namespaces():
    why = available()
    assert why is None, why


def test_firewalled_peers_with_no_route_between_them_exchange_data_through_the_relay(tmp_path):
    results = _run(tmp_path, nat=False)
    for name, result in results.items():
        assert result["status"] == "private", name
        assert "/p2p-circuit/" in result["addr"]
        assert result["verified"] == PRIVATE - 1, f"{name} verified {result['verified']} of {PRIVATE - 1} blobs"
        assert set(result["kinds"].values()) == {"relayed"}, result["kinds"]  # no route: hole punching cannot work


def test_behind_nat_hole_punching_turns_relayed_connections_into_direct_ones(tmp_path):
    results = _run(tmp_path, nat=True)
    punched = sum(kind == "hole-punched" for r in results.values() for kind in r["kinds"].values())
    ends = PRIVATE * (PRIVATE - 1)
    print(f"hole-punched: {punched} of {ends} connection ends")
    for name, result in results.items():
        assert result["status"] == "private", name
        assert result["verified"] == PRIVATE - 1, f"{name} verified {result['verified']} of {PRIVATE - 1} blobs"
    assert punched > ends // 2, {n: r["kinds"] for n, r in results.items()}
