"""Private peers over real network stacks (swarm/bench/netns.py): relayed when nothing else works, hole-punched
behind NAT.

Each test builds its own namespaces, runs one public relay and three private peers as processes
(tests/p2p/netns_peer.py), and removes everything on exit. Needs root and nftables (install.sh installs it).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import pytest

from swarm.bench.netns import PUBLIC_IP, Testbed, available
from swarm.bench.reach import broadcast, relay_bound

pytestmark = pytest.mark.timeout(60)
PEER = str(Path(__file__).with_name("netns_peer.py"))
PRIVATE = 3
PUNCH_S = 25.0
"""How long a private peer behind NAT waits for all its connections to be hole-punched (it stops as soon as they
are; with no route between peers there is nothing to wait for)."""


def _run(tmp_path: Path, nat: bool) -> dict[str, dict]:
    """Start the relay and the private peers, wait (bounded) for each peer's result, return them by name."""
    punch = str(PUNCH_S if nat else 0)
    with Testbed(private=PRIVATE, nat=nat) as net:
        net.spawn(net.public, [sys.executable, PEER, "relay", PUBLIC_IP, str(tmp_path), "relay", "0", "0"],
                  log=tmp_path / "relay.log")
        procs = [net.spawn(net.private_ns(i), [sys.executable, PEER, "private", net.private_ip(i), str(tmp_path),
                                               f"p{i}", str(PRIVATE), punch], log=tmp_path / f"p{i}.log")
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
    assert punched == ends, {n: r["kinds"] for n, r in results.items()}


def test_a_broadcast_reaches_every_private_peer_verified_with_pieces_moving_between_them(tmp_path):
    """`swarm peer start` processes in firewalled namespaces with no route between them: everything they exchange
    crosses the relay, which is the publishing seed itself."""
    from p2p.identity import Identity, write_key_file
    from swarm.bench.broadcast import _make_checkpoint

    _make_checkpoint(tmp_path / "ckpt", 1)
    key = Identity.generate()
    write_key_file(tmp_path / "trainer.key", key)
    (tmp_path / "trainer.pub").write_text(json.dumps(key.public_bytes.hex()))
    # a slow seed and fast peers: the peers get most pieces from each other, through the relay
    args = argparse.Namespace(peers=2, size_mb=1, upload_mbps=200, seed_upload_mbps=4, piece_kb=256, timeout=45,
                              warmup=15)
    with Testbed(private=args.peers, nat=False) as net:
        result = broadcast(tmp_path, args, net)
    assert result["verified"]  # every private store reassembled, BLAKE3 equal to the original
    assert result["relayed_addrs"]  # each private peer announced only its relayed address
    assert sum(result["uploads"]) > 0, "no piece moved between private peers"
    assert result["kinds"] == {"p1": {"p2": "relayed"}, "p2": {"p1": "relayed"}}
    assert result["t"] >= relay_bound(2**20, 4e6 / 8, 200e6 / 8, 2) * 0.9


@pytest.mark.timeout(480)
def test_a_short_training_run_completes_with_the_validator_and_the_inference_peer_private(tmp_path):
    """tests/swarm/test_swarm_processes.py's run, with only the trainer public: the validator and the worker reach it,
    and each other, through the trainer's relay."""
    from p2p.identity import Identity, write_key_file
    from swarm.bench.broadcast import EventProcess
    from swarm.bench.netns import python_argv
    from tests.swarm.test_swarm_processes import TRAINER_TOML

    key = Identity.generate()
    write_key_file(tmp_path / "run.key", key)
    (tmp_path / "trainer.toml").write_text(TRAINER_TOML.replace("steps = 2\n", "steps = 1\n"))  # one step is a run

    def start(ns: str, name: str, ip: str, *flags: str) -> EventProcess:
        argv = python_argv(ns, "swarm", "peer", "start", "--json", "--run", "ns", "--listen",
                           f"/ip4/{ip}/tcp/4001", "--data-dir", str(tmp_path / name), *flags)
        return EventProcess(argv, tmp_path / f"{name}.log")

    peers: list[EventProcess] = []
    with Testbed(private=2, nat=False) as net:
        try:
            deadline = time.monotonic() + 420  # three processes load torch on a shared 2-core machine
            trainer = start(net.public, "trainer", PUBLIC_IP, "--role", "trainer", "--role", "seed",
                            "--trainer-config", str(tmp_path / "trainer.toml"),
                            "--identity-key", str(tmp_path / "run.key"),
                            "--replicas", "1", "--quorum", "1", "--prompts-per-worker", "4", "--exit-when-trained")
            peers.append(trainer)
            joined = ["--bootstrap", trainer.wait_for("listening", deadline)["addrs"][0],
                      "--trainer-key", key.public_bytes.hex(), "--model", "tiny"]
            validator = start(net.private_ns(1), "validator", net.private_ip(1), "--role", "validator", *joined)
            worker = start(net.private_ns(2), "worker", net.private_ip(2), "--role", "inference", *joined)
            peers += [validator, worker]
            trained = trainer.wait_for("trained", deadline)
            assert trainer.popen.wait(10) == 0
            worker_addrs = worker.wait_for("listening", deadline)["addrs"]
            votes = validator.wait_for("validated", deadline)
        finally:
            for peer in peers:
                peer.stop()
    assert trained["steps"] == 1
    assert all("/p2p-circuit/" in a for a in worker_addrs)
    assert votes["accepted"] >= 4 and votes["rejected"] == 0
