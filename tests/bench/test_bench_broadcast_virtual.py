"""The virtual-time broadcast: real SwarmServices over memnet links of a bounded neighbourhood, and the link outbox
that lets announcements and requests overtake queued pieces."""

from __future__ import annotations

import json
import random
import subprocess
import sys

import pytest
import trio

from p2p.pieces.engine import EngineConfig, SendPiece
from p2p.pieces.outbox import Outbox
from p2p.pieces.wire import Have, Request
from swarm.bench.broadcast_virtual import VirtualSwarm, make_virtual_policy, neighbour_graph, simulate_virtual_broadcast

MB = 1 << 20


def test_the_neighbourhood_is_bounded_and_connected():
    names = [f"n{i}" for i in range(300)]
    edges = neighbour_graph(names, 8, random.Random(1))
    degree = {n: 0 for n in names}
    links = {n: set() for n in names}
    for a, b in edges:
        degree[a] += 1
        degree[b] += 1
        links[a].add(b)
        links[b].add(a)
    assert max(degree.values()) <= 8 and min(degree.values()) >= 2
    reached, frontier = {"n0"}, ["n0"]
    while frontier:
        frontier = [m for n in frontier for m in links[n] if m not in reached]
        reached.update(frontier)
    assert reached == set(names)


async def test_control_messages_overtake_queued_pieces(autojump_clock):
    box = Outbox()
    box.put_piece(SendPiece("p", 1))
    box.put_piece(SendPiece("p", 2))
    box.put_control(Have(7))
    box.put_control(Request(3))
    assert len(box) == 4
    assert await box.take() == ([Have(7), Request(3)], None)  # both at once, ahead of the pieces queued before
    assert await box.take() == ([], SendPiece("p", 1))
    box.put_control(Have(8))
    assert await box.take() == ([Have(8)], None)
    assert await box.take() == ([], SendPiece("p", 2))
    with trio.move_on_after(1) as scope:
        await box.take()
    assert scope.cancelled_caught  # an empty outbox parks its sender


async def test_a_virtual_broadcast_reaches_every_peer_of_a_bounded_neighbourhood(tmp_path, autojump_clock):
    manifest = make_virtual_policy(tmp_path / "policy", 2 * MB)
    shape = VirtualSwarm(peers=24, degree=6)
    result = await simulate_virtual_broadcast(manifest, tmp_path / "policy", shape)
    assert set(result.completion_seconds) == {f"peer{i}" for i in range(24)}
    assert result.bound_seconds == pytest.approx(manifest.total_size / shape.seed_upload_bps)
    # nothing beats the caps, and peers share: the seed alone would take about 24x the bound. Trio's randomised
    # scheduling varies the ratio from run to run (1.0 to 3.2 seen at this size), so the bound here is loose.
    assert 1.0 <= result.ratio < 4.0
    assert result.seed_upload_ratio < 4.0  # the super-seed sends a few copies, not one per peer


def test_the_bench_command_prints_the_virtual_figures(tmp_path):
    out = subprocess.run([sys.executable, "-m", "swarm", "bench", "broadcast", "--virtual", "--peers", "6",
                          "--degree", "4", "--size-mb", "1", "--json", "--work-dir", str(tmp_path)],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    result = json.loads(out.stdout)
    assert result["virtual"] is True and result["all_verified"] is True and result["peers"] == 6
    assert result["t_swarm_over_t_min"] >= 1.0 and result["t_min_s"] > 0


async def test_busy_refusals_cross_the_wire_and_every_peer_still_completes(tmp_path, autojump_clock):
    """One upload slot and no backlog: nearly every request meets a busy uploader. Read as "lacks the piece", the
    refusals would leave peers believing nobody holds what they miss, and the broadcast would never end."""
    manifest = make_virtual_policy(tmp_path / "policy", 2 * MB)
    shape = VirtualSwarm(peers=12, degree=4)
    with trio.fail_after(600):
        result = await simulate_virtual_broadcast(manifest, tmp_path / "policy", shape,
                                                  engine=EngineConfig(upload_slots=1, upload_backlog=0))
    assert set(result.completion_seconds) == {f"peer{i}" for i in range(12)}
