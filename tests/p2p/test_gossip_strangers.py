"""What a crowd of fresh identities can make one node decode: together, no more than the node's allowance for
strangers, however many identities there are (p2p.gossip.admission); peers the node knows keep their own
allowances through such a flood, and a stranger's refusal costs nobody (p2p.gossip.penalties); scoring the refused
messages of many identities costs a bounded amount per penalty (p2p.scores)."""

from __future__ import annotations

import pytest

from p2p.gossip.admission import AdmissionConfig, GossipAdmission
from p2p.gossip.envelope import KINDS
from p2p.scores import PeerScores, ScoreConfig

CONFIG = AdmissionConfig(heartbeat_interval_s=3.0, stranger_messages_per_s=20.0, stranger_burst=40.0,
                         known_after_s=30.0)


def crowd_admitted(gate: GossipAdmission, identities: int, seconds: int, start: float = 0.0) -> int:
    """Every identity sends a heartbeat every 100 ms for `seconds` (rotating through them), from `start`."""
    admitted = 0
    for tick in range(seconds * 10):
        now = start + tick / 10
        for i in range(identities):
            admitted += gate.admit("heartbeat", f"fresh{i}", f"fresh{i}", 300, now) is None
    return admitted


@pytest.mark.parametrize("identities", [10, 100, 1000])
def test_any_number_of_fresh_identities_together_get_the_strangers_allowance_and_no_more(identities):
    gate = GossipAdmission(CONFIG)
    bound = CONFIG.stranger_burst + CONFIG.stranger_messages_per_s * 5
    assert crowd_admitted(gate, identities, seconds=5) <= bound


def test_known_peers_keep_their_allowance_while_a_crowd_of_strangers_floods():
    gate = GossipAdmission(CONFIG)
    assert gate.admit("heartbeat", "honest", "honest", 300, 0.0) is None  # first heard before the flood
    honest = 0
    for second in range(31, 61):
        for i in range(200):  # 200 fresh identities per second, each a burst of heartbeats
            for _ in range(3):
                gate.admit("heartbeat", f"fresh{second}-{i}", f"fresh{second}-{i}", 300, float(second))
        if second % 6 == 0:  # the honest peer's heartbeat every 6 s, relayed by a stranger or not
            honest += gate.admit("heartbeat", "honest", f"fresh{second}-0", 300, second + 0.5) is None
    assert honest == 5
    for i in range(200):
        gate.admit("heartbeat", f"fresh61-{i}", f"fresh61-{i}", 300, 61.0)
    assert gate.admit("heartbeat", "newcomer", "newcomer", 300, 61.0) == "strangers_busy"
    assert gate.admit("heartbeat", "newcomer", "newcomer", 300, 63.0) is None  # the allowance refills


def test_a_crowd_flooding_one_kind_leaves_the_strangers_allowance_of_the_others():
    """Heartbeats of honest newcomers (under one a second from a whole run: they stretch with its size) are not
    crowded out by a flood of strangers' votes or rollouts, nor the other way round."""
    gate = GossipAdmission(CONFIG)
    for i in range(1000):
        gate.admit("vote", f"crowd{i}", f"crowd{i}", 300, 0.0)
    assert gate.admit("vote", "newcomer", "newcomer", 300, 0.0) == "strangers_busy"
    assert gate.admit("heartbeat", "newcomer", "newcomer", 300, 0.0) is None


def test_a_crowd_churning_fresh_identities_does_not_reset_the_allowances_of_known_peers():
    """Every message a fresh identity sends makes buckets for it; they must not push out a known peer's, which
    would hand it a fresh burst each time the crowd churned the table."""
    config = AdmissionConfig(heartbeat_interval_s=3.0, max_tracked=500, known_after_s=30.0)
    gate = GossipAdmission(config)
    assert gate.admit("heartbeat", "known", "known", 300, 0.0) is None
    verdicts = [gate.admit("heartbeat", "known", "known", 300, 40.0) for _ in range(3)]
    assert verdicts == [None, None, "rate_limited"]  # known from 30 s on; its burst of two spent
    for i in range(1000):
        gate.admit("heartbeat", f"fresh{i}", f"fresh{i}", 300, 40.0)
    assert gate.admit("heartbeat", "known", "known", 300, 40.0) == "rate_limited"


def test_a_stranger_becomes_known_only_after_it_has_been_heard_for_a_while():
    gate = GossipAdmission(CONFIG)
    assert gate.admit("heartbeat", "p", "p", 300, 0.0) is None
    for i in range(int(CONFIG.stranger_burst)):
        gate.admit("heartbeat", f"crowd{i}", f"crowd{i}", 300, 4.0)
    assert gate.admit("heartbeat", "p", "p", 300, 4.0) == "strangers_busy"  # heard once: still a stranger
    for i in range(int(CONFIG.stranger_burst)):
        gate.admit("heartbeat", f"crowd-late{i}", f"crowd-late{i}", 300, 33.0)
    assert gate.admit("heartbeat", "p", "p", 300, 33.0) is None  # heard 33 s ago: known


def test_a_stranger_flooding_past_its_own_rate_is_refused_for_it_even_while_the_strangers_allowance_is_spent():
    """A refusal for the shared allowance costs nobody, so it must not hide a flood: what a stranger sends past its
    own rate is refused as "rate_limited" (which costs it) whether or not the shared allowance had room."""
    gate = GossipAdmission(CONFIG)
    for i in range(int(CONFIG.stranger_burst)):
        gate.admit("heartbeat", f"crowd{i}", f"crowd{i}", 300, 0.0)
    verdicts = [gate.admit("heartbeat", "flooder", "flooder", 300, t / 100) for t in range(100)]
    assert verdicts[:2] == ["strangers_busy"] * 2
    assert verdicts.count("rate_limited") >= 90


def test_scoring_a_crowd_of_identities_forgets_the_mildest_in_batches_not_at_every_penalty():
    """Every refused message costs a penalty: with the score table full, forgetting its mildest entry must not cost
    a sort of the whole table each time (10,000 tracked identities made each penalty cost 14 ms)."""
    scores = PeerScores(ScoreConfig(max_peers=800))
    sizes = []
    for i in range(2000):
        scores.penalize(f"fresh{i}", "rate_limited", i / 1000)
        sizes.append(len(scores._scores))
    assert max(sizes) <= 900  # at most an eighth above the bound
    trims = sum(1 for before, after in zip(sizes, sizes[1:]) if after < before)
    assert 1 <= trims <= 2000 // 100


def test_a_crowd_rotating_identities_in_every_kind_cannot_keep_an_admitted_newcomer_a_stranger():
    """An origin admitted once is known `known_after_s` later: a crowd admitting fresh identities of every kind at
    the strangers' allowances (more new origins a second than `max_tracked` holds for `known_after_s`) does not
    push it out before then, else it would stay a stranger, refused with the crowd, for as long as the crowd goes
    on."""
    config = AdmissionConfig()
    gate = GossipAdmission(config)
    assert gate.admit("heartbeat", "newcomer", "newcomer", 300, 0.0) is None
    fresh = 0
    for tick in range(int(config.known_after_s * 10) + 10):
        now = tick / 10
        for kind in KINDS:
            for _ in range(int(config.stranger_messages_per_s / 10) + 5):
                fresh += 1
                gate.admit(kind, f"crowd{fresh}", "relay", 300, now)
    for _ in range(int(config.stranger_burst)):
        gate.admit("heartbeat", f"crowd{fresh}", "relay", 300, config.known_after_s + 1.5)
        fresh += 1
    assert gate.admit("heartbeat", "newcomer", "newcomer", 300, config.known_after_s + 1.5) is None
