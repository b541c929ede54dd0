"""`swarm bench sybil` at its smallest: four fresh identities against real `swarm peer start` targets, a few seconds
per kind. The JSON has one row per kind with the target's measured cost, and the measurements are real: the flood's
identities are banned by the target and its CPU and memory come from the running process."""

from __future__ import annotations

import json

from p2p.host.p2p_host import open_host
from p2p.identity import Identity
from swarm.bench.sybil import finish_row
from swarm.bench.sybil_measure import attacker_config, dialing_from, loopback_ip
from swarm.cli.main import main

ROW_KEYS = {"kind", "identities", "target_cpu_share", "target_rss_above_baseline_mib", "honest_completion_s",
            "forwarded", "bans", "third_party_connections", "peer_died", "targets", "pass"}


def test_gossip_kinds_report_the_targets_real_cost_as_json(capsys):
    argv = ["bench", "sybil", "--identities", "4", "--seconds", "5", "--parallel", "2",
            "--kinds", "gossip-flood,rollout-bombs", "--json"]
    assert main(argv) == 0
    report = json.loads(capsys.readouterr().out)
    flood, bombs = report["kinds"]
    assert report["identities"] == 4 and [flood["kind"], bombs["kind"]] == ["gossip-flood", "rollout-bombs"]
    for row in (flood, bombs):
        assert ROW_KEYS <= set(row)
        assert isinstance(row["peer_died"], bool) and row["target_cpu_share"] > 0
        assert row["target_baseline_rss_mib"] > 50 and row["identities_used"] >= 1
        assert set(row["targets"]) == {"no_peer_died", "cpu_under_10pct", "rss_under_150mib"}
        assert row["pass"] == all(row["targets"].values())
    assert flood["bans"] > 0 and flood["refused"] > 0 and flood["sent"] > flood["forwarded"]
    assert bombs["sent"] > 0 and bombs["peer_died"] is False


def test_each_target_is_judged_from_the_row():
    row = finish_row("relay", 10, {"target_cpu_share": 0.5, "target_rss_above_baseline_mib": 10.0,
                                   "peer_died": False, "honest_completion_s": {"with": 31.0, "without": 10.0},
                                   "third_party_connections": 30, "reservation_after_s": None})
    assert row["targets"] == {"no_peer_died": True, "cpu_under_10pct": False, "rss_under_150mib": True,
                              "honest_within_3x": False, "third_party_few_per_identity": True,
                              "reservation_within_seconds": False}
    assert row["pass"] is False
    fine = finish_row("relay", 10, {"target_cpu_share": 0.01, "target_rss_above_baseline_mib": 1.0,
                                    "peer_died": False, "honest_completion_s": {"with": 29.0, "without": 10.0},
                                    "third_party_connections": 31, "reservation_after_s": 1.5})
    assert fine["targets"]["honest_within_3x"] and not fine["targets"]["third_party_few_per_identity"]
    few_acted = finish_row("hole-punch", 100, {"target_cpu_share": 0.01, "target_rss_above_baseline_mib": 1.0,
                                               "peer_died": False, "third_party_connections": 40,
                                               "identities_used": 10})
    assert not few_acted["targets"]["third_party_few_per_identity"]  # per identity that attacked, not per one made


def test_an_unknown_kind_or_a_nonsense_size_is_one_sentence(capsys):
    assert main(["bench", "sybil", "--kinds", "gossip-flood,teleport"]) == 2
    assert "teleport" in capsys.readouterr().err
    assert main(["bench", "sybil", "--squat-mb", "0"]) == 2
    assert "--squat-mb" in capsys.readouterr().err


def test_relay_and_hole_punch_kinds_measure_reservations_and_third_party_dials(capsys):
    argv = ["bench", "sybil", "--identities", "4", "--seconds", "8", "--kinds", "relay,hole-punch", "--json"]
    assert main(argv) == 0
    relay, punch = json.loads(capsys.readouterr().out)["kinds"]
    assert ROW_KEYS <= set(relay) and ROW_KEYS <= set(punch)
    assert relay["crowd_ips"] == "many" and relay["reservations_granted"] == 4  # all fit under the relay's caps
    assert relay["reservation_after_s"] is not None and relay["circuits_held"] == 4
    assert relay["honest_circuit_s"] is not None and relay["honest_circuit_after_crowd_s"] is not None
    assert relay["targets"]["reservation_within_seconds"] and relay["targets"]["honest_circuit_after_crowd"]
    assert punch["relay"] == "bench" and punch["circuits_refused"] == 0  # the bench's relay has room for all
    assert punch["circuits"] >= 1 and punch["sessions_answered"] >= 1
    assert punch["third_party_connections"] > 0  # the private peer dialed the addresses the attackers named
    assert "third_party_few_per_identity" in punch["targets"]
    assert not relay["peer_died"] and not punch["peer_died"]


def test_a_crowd_cut_short_by_the_time_limit_still_reports_what_it_did(capsys):
    argv = ["bench", "sybil", "--identities", "12", "--parallel", "1", "--seconds", "0.3", "--kinds", "relay",
            "--json"]
    assert main(argv) == 0
    relay = json.loads(capsys.readouterr().out)["kinds"][0]
    tried = relay["reservations_granted"] + relay["reservations_refused"] + relay["attackers_failed"]
    assert tried < 12  # the time limit came first; the honest peers' figures are still measured
    assert relay["reservation_after_s"] is not None


async def test_a_bench_host_connects_from_its_own_loopback_address():
    """The per-IP caps of a target see each bench party apart only if its connections leave from its own address."""
    ip = loopback_ip(5)
    assert ip == "127.0.0.21" and loopback_ip(250) == "127.0.1.10"
    async with open_host() as target, open_host(attacker_config(Identity.generate(), ip=ip), dialing_from(ip)) as host:
        await host.connect(target.multiaddrs[0])
        (conn,) = target.libp2p.get_network().connections[host.libp2p.get_id()]
        assert [str(a).split("/")[2] for a in conn.get_transport_addresses()] == [ip]


def test_a_crowd_on_the_honest_peers_ip_leaves_the_relay_free_for_them_once_it_is_gone(capsys):
    """All on 127.0.0.1, the relay's per-IP cap lumps the honest peers in with the crowd: the early honest peer and
    seven attackers fill it, yet once the crowd's hosts close their places are free again and the late honest peer
    reserves, and an honest circuit opens once the crowd's circuits closed."""
    argv = ["bench", "sybil", "--identities", "10", "--kinds", "relay", "--crowd-ips", "one", "--json"]
    assert main(argv) == 0
    relay = json.loads(capsys.readouterr().out)["kinds"][0]
    assert relay["crowd_ips"] == "one" and (relay["reservations_granted"], relay["reservations_refused"]) == (7, 3)
    assert relay["targets"]["reservation_within_seconds"] and relay["targets"]["honest_circuit_after_crowd"]
