"""`swarm bench scale`: the estimate's arithmetic, the socket counters it reads, the wait for a swarm's data channels
to settle, and a tiny run end to end."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from swarm.bench import scale, scale_measure
from swarm.node.node import provides_key


def _sizes():
    """Idle: 0.5 % fixed, 0.05 % per connection and 0.1 % per delivery (the chatty windows add 2 deliveries a
    second each); 2 kB/s fixed, 100 B/s per connection, 500 B per delivery. A version costs 0.02 CPU s and 40 kB
    per data link, each peer linking every other."""
    rows = []
    for n, d in ((8, 1.5), (16, 3.0), (32, 4.5)):
        idle_cpu = 0.005 + 0.0005 * (n - 1) + 0.001 * d
        idle_kb = (2000 + 100 * (n - 1) + 500 * d) / 1000
        rows.append({"peers": n, "idle_connected": n - 1, "idle_gossip_delivered_per_s": d,
                     "idle_cpu_share": idle_cpu, "idle_kb_per_s": idle_kb, "chatty_gossip_delivered_per_s": d + 2,
                     "chatty_cpu_share": idle_cpu + 0.002, "chatty_kb_per_s": idle_kb + 1.0,
                     "links_per_version": n - 1, "version_cpu_s": 0.02 * (n - 1), "version_kb": 40.0 * (n - 1)})
    return rows


def test_the_estimate_adds_upkeep_per_delivery_and_connection_and_a_cost_per_version_and_link():
    sizes = _sizes()
    heartbeats = {8: 1.2, 16: 2.5, 32: 4.0, 1000: 4.0}  # what the virtual-time run counts
    est = scale.estimate(sizes, heartbeats, 1000, every=100.0, max_links=32)
    assert est["cpu_s_per_delivery"] == pytest.approx(0.001) and est["bytes_per_delivery"] == 500
    assert est["cpu_share_per_connection"] == pytest.approx(0.0005) and est["bytes_per_s_per_connection"] == 100
    assert est["fixed_cpu_share"] == pytest.approx(0.005) and est["fixed_bytes_per_s"] == 2000
    assert est["gossip_delivered_per_s"] == pytest.approx(4.5)  # 0.5 of other gossip + 4.0 heartbeats
    assert est["connections"] == 32  # max_links, however many peers there are
    assert est["upkeep_cpu_share"] == pytest.approx(0.005 + 0.0005 * 32 + 0.001 * 4.5)
    assert est["upkeep_bytes_per_s"] == 2000 + 100 * 32 + 500 * 4.5
    # 32 links at 1,000 peers (max_links), one version per 100 s
    assert est["links_per_version"] == 32 and est["version_cpu_s_per_link"] == pytest.approx(0.02)
    assert est["version_cpu_share"] == pytest.approx(0.02 * 32 / 100)
    assert est["version_bytes_per_s"] == pytest.approx(40_000 * 32 / 100)
    assert est["cpu_share"] == pytest.approx(0.0255 + 0.0064) and est["within_budget"] is False
    assert scale.estimate(sizes, heartbeats, 32, every=100.0, max_links=32)["links_per_version"] == 31
    # links bound by links_per_version at the largest size: that many at 1,000 too
    bound = [{**size, "links_per_version": 8, "version_cpu_s": 0.16, "version_kb": 320.0} for size in sizes]
    est = scale.estimate(bound, heartbeats, 1000, every=100.0, max_links=32)
    assert est["links_per_version"] == 8 and est["version_cpu_share"] == pytest.approx(0.02 * 8 / 100)
    dear = scale.estimate(sizes, {**heartbeats, 1000: 0.5}, 1000, every=1000.0, max_links=8)
    # the 31 connections the largest size held count, not the bound of 8 (connections in use are never trimmed)
    assert dear["cpu_share"] == pytest.approx(0.005 + 0.0005 * 31 + 0.001 * 1.0 + 0.02 * 8 / 1000, abs=1e-4)
    assert dear["within_budget"] is False
    lean = [{**s, "idle_cpu_share": s["idle_cpu_share"] - 0.0004 * (s["peers"] - 1),
             "chatty_cpu_share": s["chatty_cpu_share"] - 0.0004 * (s["peers"] - 1)} for s in sizes]  # 0.01 %/conn
    cheap = scale.estimate(lean, {**heartbeats, 1000: 0.5}, 1000, every=1000.0, max_links=8)
    assert cheap["cpu_share"] == pytest.approx(0.005 + 0.0001 * 31 + 0.001 * 1.0 + 0.02 * 8 / 1000, abs=1e-4)
    assert cheap["within_budget"] is True
    heartbeats[1000] = 200.0  # heartbeats that flood at a fixed period: 1,000 peers / 6 s, and some
    assert scale.estimate(sizes, heartbeats, 1000, every=1000.0, max_links=8)["within_budget"] is False


def test_without_chatter_deliveries_cost_nothing_and_connections_carry_the_idle_growth():
    sizes = [{k: v for k, v in size.items() if not k.startswith("chatty")} for size in _sizes()]
    est = scale.estimate(sizes, {8: 1.2, 16: 2.5, 32: 4.0, 1000: 4.0}, 1000, every=100.0, max_links=32)
    assert est["cpu_s_per_delivery"] == 0 and est["cpu_share_per_connection"] > 0.0005


def test_a_versions_cost_is_the_publishing_windows_extra_spread_over_the_versions_published_in_it():
    """A window shorter than the time between versions (or not a multiple of it) holds fewer seconds per version
    than `--version-every`: multiplied by that instead, a 1 s window with a version every 2 s doubled every cost."""
    def rows(cpu_share, kb_per_s, versions):
        return [{"cpu_share": cpu_share, "rss_mb": 100.0, "links_per_version": 4.0, "gossip_delivered_per_s": 1.0,
                 "recv_kb_per_s": kb_per_s / 2, "sent_kb_per_s": kb_per_s / 2, "payload_kb_per_s": 0.0,
                 "sockets": 9, "peers_known": 2, "connected": 2, "versions": versions}] * 2

    idle = rows(0.01, 10.0, 0)
    one = scale._summary(2, idle, rows(0.11, 110.0, 1), window=1.0)  # one version, published at the start of 1 s
    assert one["version_cpu_s"] == pytest.approx(0.1) and one["version_kb"] == pytest.approx(100.0)
    two = scale._summary(2, idle, rows(0.11, 110.0, 2), window=20.0)  # two versions in 20 s (one every 15 s)
    assert two["version_cpu_s"] == pytest.approx(1.0) and two["version_kb"] == pytest.approx(1000.0)


def test_socket_bytes_are_listed_per_process_and_connection(monkeypatch):
    listing = (
        'ESTAB 0 0 127.0.0.1:1 127.0.0.1:2 users:(("python",pid=11,fd=3))\n'
        "\t bbr bytes_sent:100 bytes_acked:100 bytes_received:40 segs_out:3\n"
        'ESTAB 0 0 127.0.0.1:3 127.0.0.1:4 users:(("python",pid=11,fd=4))\n'
        "\t bbr bytes_sent:5 bytes_received:7\n"
        'ESTAB 0 0 127.0.0.1:5 127.0.0.1:6 users:(("python",pid=12,fd=9))\n'
        "\t bbr rto:204\n"
    )
    monkeypatch.setattr(scale_measure.subprocess, "run",
                        lambda *a, **k: subprocess.CompletedProcess(a, 0, listing, ""))
    assert scale_measure.socket_bytes() == {11: {"127.0.0.1:1 127.0.0.1:2": (100, 40),
                                                 "127.0.0.1:3 127.0.0.1:4": (5, 7)},
                                            12: {"127.0.0.1:5 127.0.0.1:6": (0, 0)}}


def test_bytes_moved_count_each_connection_open_at_the_end_and_never_less_than_nothing():
    before = {"a": (1000, 5000), "gone": (900_000, 800_000)}  # a dropped version's link closes in the window
    after = {"a": (1500, 5200), "new": (300, 1_100_000)}  # a new version's link opens in it
    assert scale_measure.bytes_moved(before, after) == (500 + 300, 200 + 1_100_000)
    assert scale_measure.bytes_moved(after, {}) == (0, 0)


def test_payload_is_what_each_versions_running_totals_grew_by_within_the_window():
    def progress(t, version, up, down):
        return {"event": "progress", "t": t, "version": version, "up_bytes": up, "down_bytes": down}

    class Process:
        def events(self, kind):
            assert kind == "progress"
            return [progress(1.0, 1, 0, 1_000_000), progress(9.0, 1, 500_000, 1_048_576),  # before the window
                    progress(11.0, 1, 600_000, 1_048_576), progress(13.0, 1, 700_000, 1_048_576),
                    progress(12.0, 2, 0, 400_000), progress(14.0, 2, 100_000, 1_048_576),  # a version in it
                    progress(30.0, 2, 900_000, 1_048_576)]  # after it

    assert scale_measure.payload_bytes(Process(), since=10.0, until=20.0) == 200_000 + 1_148_576


def test_version_bytes_are_protocol_bytes_the_pieces_moved_are_not_counted():
    def rows(kb_per_s, payload, versions):
        return [{"cpu_share": 0.01, "rss_mb": 100.0, "links_per_version": 4.0, "gossip_delivered_per_s": 1.0,
                 "recv_kb_per_s": kb_per_s / 2, "sent_kb_per_s": kb_per_s / 2, "payload_kb_per_s": payload,
                 "sockets": 9, "peers_known": 2, "connected": 2, "versions": versions}] * 2

    summary = scale._summary(2, rows(10.0, 0.0, 0), rows(130.0, 110.0, 2), window=20.0)
    assert summary["version_kb"] == pytest.approx(100.0)  # (130 - 110 - 10) kB/s over 10 s a version
    assert summary["payload_kb_per_s"] == pytest.approx(110.0)


class _Peer:
    """A bench process as the waits see it: its events, each stamped with a time."""

    def __init__(self, stamps: dict[str, list[float]]) -> None:
        self.stamps = stamps

    def count_since(self, kinds: tuple[str, ...], since: float) -> int:
        return sum(t >= since for kind in kinds for t in self.stamps.get(kind, []))


def test_links_settle_when_the_peers_open_fewer_than_two_channels_each_in_ten_seconds():
    # two peers: a join's spares every second until t = 30, then one renewal per peer
    peers = [_Peer({"spare": [float(t) for t in range(31)] + [38.0], "link": [5.0, 29.5]}), _Peer({"spare": [36.0]})]
    assert not scale_measure.links_settled(peers, now=30.0)  # 11 spares and a link in the last 10 s
    assert not scale_measure.links_settled(peers, now=37.0)  # still 4 (31-36 s)
    assert scale_measure.links_settled(peers, now=40.5)  # 38 s and 36 s: one each
    clock = [20.0]

    def sleep(seconds: float) -> None:
        clock[0] += seconds

    assert scale_measure.wait_links_settled(peers, deadline=100.0, clock=lambda: clock[0], sleep=sleep)
    assert clock[0] == 40.0  # the first whole second at which the last 10 s held 3 channels, fewer than 2 a peer
    busy = [_Peer({"spare": [float(t) / 2 for t in range(400)]})]
    clock[0] = 0.0
    assert not scale_measure.wait_links_settled(busy, deadline=50.0, clock=lambda: clock[0], sleep=sleep)
    assert clock[0] == 50.0


def test_a_tiny_scale_run_reports_every_figure(tmp_path):
    out = subprocess.run([sys.executable, "-m", "swarm", "bench", "scale", "--sizes", "1,2", "--window", "1",
                          "--settle", "0", "--version-every", "2", "--estimate-peers", "30", "--json",
                          "--work-dir", str(tmp_path)], capture_output=True, text=True, timeout=240)
    assert out.returncode == 0, out.stderr[-2000:]
    result = json.loads(out.stdout)
    assert [s["peers"] for s in result["sizes"]] == [1, 2]
    for size in result["sizes"]:
        assert 0 <= size["cpu_share"] < 2 and 0 < size["rss_mb"] < 400 and size["sockets"] >= 1
        assert 0 <= size["idle_cpu_share"] < 2 and size["version_cpu_s"] >= 0 and size["version_kb"] >= 0
        assert size["links_per_version"] >= 0 and size["payload_kb_per_s"] >= 0
    assert result["estimate"]["peers"] == 30 and "within_budget" in result["estimate"]
    assert 0 <= result["estimate"]["links_per_version"] <= 29
    assert result["heartbeats_received_per_peer_s_virtual"]["30"] > 0


def test_the_peers_announce_versions_as_often_as_at_the_estimated_size():
    def share(peers_known: int, wanted: float, draws: int = 20_000) -> float:
        return sum(provides_key(os.urandom(32), os.urandom(16), peers_known, wanted) for _ in range(draws)) / draws

    at_target = share(999, scale.DHT_PROVIDERS_WANTED)  # a peer of a 1,000-peer run, as the node draws it
    at_16 = share(16, scale.providers_as_at(1000, 16))  # a bench peer of 16, knowing the 15 others and the publisher
    assert at_target == pytest.approx(0.02, rel=0.2) and at_16 == pytest.approx(at_target, rel=0.3)
    assert share(8, scale.providers_as_at(1000, 16)) > at_16  # at a smaller size more often: the estimate errs high


def test_connections_at_the_target_are_the_trimmers_bound_when_given():
    sizes, heartbeats = _sizes(), {8: 1.2, 16: 2.5, 32: 4.0, 1000: 4.0}
    assert scale.estimate(sizes, heartbeats, 1000, every=100.0, max_links=32, max_connections=40)["connections"] == 40
    assert scale.estimate(sizes, heartbeats, 32, every=100.0, max_links=32, max_connections=40)["connections"] == 31


def test_connections_the_largest_size_held_past_the_trimmers_bound_count_at_the_target():
    """Connections in use (mesh, data links, streams) are never trimmed: 64 peers held 44-47 each with a bound of
    40, so pricing 40 at 1,000 peers left some of what a peer measurably holds out of the estimate."""
    sizes, heartbeats = _sizes(), {8: 1.2, 16: 2.5, 32: 4.0, 1000: 4.0}
    sizes[-1]["idle_connected"] = 46.5
    held = scale.estimate(sizes, heartbeats, 1000, every=100.0, max_links=32, max_connections=40)
    assert held["connections"] == 46.5
    sizes[-1]["idle_connected"] = 31
    assert scale.estimate(sizes, heartbeats, 1000, every=100.0, max_links=32, max_connections=40)["connections"] == 40


def test_a_versions_cpu_leaves_out_the_heartbeats_its_window_had_more_or_fewer_of_than_the_idle_one():
    """Heartbeats come at random times, so a publishing window may hold more or fewer than the idle window before
    it: their price per delivery comes out of (or back into) the versions' CPU; each version's own announcement,
    one delivery, stays in it."""
    def rows(cpu_share, delivered, versions):
        return [{"cpu_share": cpu_share, "rss_mb": 100.0, "links_per_version": 8.0, "gossip_delivered_per_s": delivered,
                 "recv_kb_per_s": 1.0, "sent_kb_per_s": 1.0, "payload_kb_per_s": 0.0,
                 "sockets": 9, "peers_known": 2, "connected": 2, "versions": versions}] * 2

    idle = rows(0.010, 0.5, 0)
    chatty = rows(0.012, 1.5, 0)  # one more delivery a second costs 0.2 % of a core: 2 ms each
    # two versions in 20 s; 0.15 deliveries a second more than idle: 2 announcements and 1 extra heartbeat per version
    busy = scale._summary(8, idle, rows(0.013, 0.65, 2), window=20.0, chatty=chatty)
    assert busy["version_other_deliveries"] == pytest.approx(0.5)
    assert busy["version_cpu_s"] == pytest.approx(0.03)
    est = scale.estimate([busy], {8: 0.5, 1000: 0.5}, 1000, every=10.0, max_links=8)
    assert est["version_cpu_s_per_link_uncorrected"] == pytest.approx(0.03 / 8, abs=1e-5)
    assert est["version_cpu_s_per_link"] == pytest.approx((0.03 - 0.002 * 0.5) / 8, abs=1e-5)
    quiet = scale._summary(8, idle, rows(0.010, 0.35, 2), window=20.0, chatty=chatty)  # fewer heartbeats than idle
    assert quiet["version_cpu_s"] == 0 and quiet["version_other_deliveries"] == pytest.approx(-2.5)
    est = scale.estimate([quiet], {8: 0.5, 1000: 0.5}, 1000, every=10.0, max_links=8)
    assert est["version_cpu_s_per_link"] == pytest.approx(0.002 * 2.5 / 8, abs=1e-5)
