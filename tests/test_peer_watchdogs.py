"""A peer that cannot take part says why and exits 1: unreachable bootstrap peers, a wrong trainer key."""

from types import SimpleNamespace

import trio

from p2p.errors import P2PError
from p2p.identity import Identity
from swarm.node.watchdogs import bootstrap_backoff, reach_bootstrap, watch_trainer_key
from swarm.policy.trust import RefusalReport, TrainerTrust

BOOTSTRAP = "/ip4/127.0.0.1/tcp/4001/p2p/12D3KooWBootstrapPeerIdThatNeverAnswers"


class _Events:
    def __init__(self):
        self.seen = []

    def emit(self, event):
        self.seen.append({"event": event.kind, "t": trio.current_time(), **event.fields()})


class _Host:
    def __init__(self, answers_on_try=None):
        self.tries, self.answers_on_try = 0, answers_on_try

    async def redial(self, addr):
        self.tries += 1
        if self.tries != self.answers_on_try:
            raise P2PError("connection refused")
        return addr


def _node(timeout_s=60.0, host=None, trust=None):
    peer = SimpleNamespace(bootstrap_timeout_s=timeout_s, bootstrap_redial_s=10.0)
    return SimpleNamespace(config=SimpleNamespace(peer=peer), peer_id="12D3KooWme", connected_peers=lambda: [],
                           host=host or _Host(), events=_Events(), done=trio.Event(), failed=False,
                           mirror=SimpleNamespace(trust=trust))


def test_backoff_doubles_up_to_the_redial_period():
    assert [bootstrap_backoff(n, 10.0) for n in range(1, 7)] == [1.0, 2.0, 4.0, 8.0, 10.0, 10.0]


async def test_an_unreachable_bootstrap_is_retried_with_one_line_per_try_then_the_peer_exits_1(autojump_clock):
    node = _node(timeout_s=60.0)
    await reach_bootstrap(node, (BOOTSTRAP,))
    retries = [e for e in node.events.seen if e["event"] == "bootstrap_retry"]
    assert [e["t"] for e in retries] == [0.0, 1.0, 3.0, 7.0, 15.0, 25.0, 35.0, 45.0, 55.0]
    assert "connection refused" in retries[0]["message"] and "try 1" in retries[0]["message"]
    final = node.events.seen[-1]
    assert final["event"] == "bootstrap_gave_up" and final["t"] == 65.0 and "10 tries" in final["message"]
    assert node.failed and node.done.is_set()


async def test_a_bootstrap_that_answers_on_a_retry_ends_the_wait(autojump_clock):
    node = _node(host=_Host(answers_on_try=3))
    await reach_bootstrap(node, (BOOTSTRAP,))
    assert [e["event"] for e in node.events.seen] == ["bootstrap_retry", "bootstrap_retry", "bootstrap_reconnected"]
    assert "try 3" in node.events.seen[-1]["message"]
    assert not node.failed and trio.current_time() == 3.0


async def test_no_bootstrap_peer_and_a_timeout_of_zero_never_give_up(autojump_clock):
    await reach_bootstrap(_node(), ())
    node = _node(timeout_s=0.0)
    with trio.move_on_after(3600):
        await reach_bootstrap(node, (BOOTSTRAP,))
    assert not node.failed and len(node.events.seen) > 300


def test_a_wrong_key_names_both_keys_and_is_said_at_most_once_a_minute(tmp_path):
    expected, forger = Identity.generate(), Identity.generate()
    trust = TrainerTrust("r", expected.public_bytes, tmp_path)
    message = trust.wrong_key(forger.public_bytes)
    assert expected.peer_id in message and forger.peer_id in message and "--trainer-key" in message
    report = RefusalReport(give_up_after_s=300.0)
    said = [(t, report.refused(message, t)) for t in range(0, 130, 2)]
    assert [t for t, line in said if line] == [0, 60, 120]
    assert dict(said)[60].endswith("(29 more refused since the last line)")


def test_a_report_gives_up_only_on_wrong_keys_and_only_when_nothing_was_accepted():
    report = RefusalReport(give_up_after_s=300.0)
    report.refused("bad signature", 0.0)
    assert not report.gave_up(10_000.0)  # a forger's refused manifest says nothing of this peer's key
    report.wrong_keys = 1
    report.refused("x", 10.0)
    assert not report.gave_up(309.0) and report.gave_up(310.0)
    report.accept()
    report.refused("x", 400.0)
    assert not report.gave_up(10_000.0)
    assert not RefusalReport(give_up_after_s=0.0).gave_up(1e9)


async def test_a_peer_that_only_refuses_exits_1_after_the_timeout(autojump_clock, tmp_path):
    trust = TrainerTrust("r", Identity.generate().public_bytes, tmp_path, give_up_after_s=120.0)
    trust.report.refused(trust.wrong_key(Identity.generate().public_bytes), 0.0)
    node = _node(trust=trust)
    await watch_trainer_key(node)
    assert node.failed and node.events.seen[-1]["event"] == "trainer_key_gave_up"
    assert node.events.seen[-1]["t"] == 120.0 and "120 s" in node.events.seen[-1]["message"]
