"""A crowd of fresh identities connecting in gets a node-wide rate of served connections, whatever its size: the
pure decisions (p2p.host.inbound_admission), then real hosts on loopback."""

import trio

from p2p.errors import HostError
from p2p.host.inbound_admission import InboundAdmission, InboundLimits
from p2p.host.p2p_host import HostConfig, open_host

LIMITS = InboundLimits(handshakes_per_s=4.0, handshakes_burst=8.0, strangers_per_s=0.5, strangers_burst=2.0,
                       known_after_s=60.0, max_tracked=100)


def test_strangers_share_one_node_wide_rate_however_many_identities():
    admission = InboundAdmission(LIMITS)
    served = sum(admission.admit_peer(f"stranger-{i}", 0.0) for i in range(1000))
    assert served == 2  # the burst
    assert admission.refused["strangers_busy"] == 998
    later = sum(admission.admit_peer(f"later-{i}", 10.0) for i in range(1000))
    assert later == 2  # 10 s at 0.5 a second refills the burst and no more


def test_handshakes_are_bounded_node_wide():
    admission = InboundAdmission(LIMITS)
    assert sum(admission.admit_handshake(0.0) for _ in range(100)) == 8
    assert sum(admission.admit_handshake(1.0) for _ in range(100)) == 4


def test_dialed_peers_and_peers_served_long_enough_are_known_and_a_ban_forgets_them():
    admission = InboundAdmission(LIMITS)
    admission.dialed("bootstrap")
    assert admission.admit_peer("old", 0.0)
    for i in range(50):  # the strangers' rate is spent
        admission.admit_peer(f"crowd-{i}", 61.0)
    assert admission.admit_peer("bootstrap", 61.0)
    assert admission.admit_peer("old", 61.0)  # admitted 61 s ago: known
    admission.forget("old")
    assert not admission.admit_peer("old", 61.0)


def test_a_stranger_reconnecting_is_not_known_before_its_time():
    admission = InboundAdmission(LIMITS)
    assert admission.admit_peer("new", 0.0)
    assert admission.admit_peer("other", 0.0)
    assert not admission.admit_peer("new", 1.0)  # its second connection is a stranger's too
    assert admission.admit_peer("new", 60.0)


def test_the_peers_remembered_are_bounded():
    admission = InboundAdmission(InboundLimits(strangers_per_s=1000.0, strangers_burst=1000.0, max_tracked=10))
    for i in range(500):
        admission.admit_peer(f"p{i}", 0.0)
    assert len(admission._admitted) == 10


async def test_a_crowd_of_fresh_identities_gets_only_the_strangers_rate_and_known_peers_still_connect():
    limits = InboundLimits(handshakes_per_s=100.0, handshakes_burst=100.0, strangers_per_s=0.01,
                           strangers_burst=2.0)
    async with open_host(HostConfig(inbound=limits)) as target, open_host() as friend:
        (addr,) = target.multiaddrs
        await target.connect(friend.multiaddrs[0])  # the target dialed it: known
        outcomes = []
        for _ in range(5):
            async with open_host() as stranger:
                try:
                    with trio.fail_after(10):
                        await stranger.connect(addr)  # refused after its handshake: the muxer never answers
                    outcomes.append(target.peer_id in stranger.connected_peers())
                except HostError:
                    outcomes.append(False)
        assert outcomes.count(True) == 2
        assert target.inbound.refused["strangers_busy"] >= 3, target.inbound.refused  # a dialer may retry
        await friend.disconnect(target.peer_id)
        with trio.fail_after(10):
            assert await friend.connect(addr) == target.peer_id


async def test_connections_past_the_handshake_rate_are_closed_before_their_handshake():
    limits = InboundLimits(handshakes_per_s=0.01, handshakes_burst=1.0)
    async with open_host(HostConfig(inbound=limits)) as target:
        (addr,) = target.multiaddrs
        results = []
        for _ in range(3):
            async with open_host() as dialer:
                try:
                    with trio.fail_after(10):
                        await dialer.connect(addr)
                    results.append(True)
                except HostError:
                    results.append(False)
        assert results == [True, False, False]
        assert target.inbound.refused["handshakes_busy"] >= 2, target.inbound.refused  # a dialer may retry
