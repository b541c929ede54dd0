"""`swarm status`: the pure view of a run's gossip, and an observer listening to real peers on loopback."""

from __future__ import annotations

import json
import os
from types import SimpleNamespace

import pytest
import trio

from p2p.errors import EnvelopeError
from p2p.identity import Identity, peer_id_from_public_bytes
from swarm.cli.status import observe
from swarm.cli.status_view import SwarmView, render, to_json
from swarm.event_types import Generated, Listening, Published, TrainStep, Validated
from swarm.events import Emitted
from swarm.messages.gossip_bodies import decode_heartbeat
from swarm.messages.votes import vote_bodies
from tests.test_swarm_nodes import Peer, signed_checkpoint, start_seeding
from verify.votes import sign_vote, verify_vote

MANIFEST_ID = bytes(range(32))


def check(name, ok, reason=""):
    return SimpleNamespace(name=name, ok=ok, reason=reason)


def group(worker, version, rewards):
    return SimpleNamespace(worker=worker, policy_version=version,
                           completions=[SimpleNamespace(reward=r) for r in rewards])


def beat(body, sender="peer"):
    """A heartbeat body as gossip's validator hands it to the view (decoded, typed)."""
    return decode_heartbeat(SimpleNamespace(sender_peer_id=sender, body=body))


def voter_of(vote):
    return peer_id_from_public_bytes(vote.validator) if verify_vote(vote) else None


def test_the_view_summarises_heartbeats_rollouts_and_votes_and_refuses_what_does_not_check_out():
    validator, impostor = Identity.generate(), Identity.generate()
    vid = validator.peer_id
    view = SwarmView()
    view.on_heartbeat("trainer", beat({"roles": ["trainer", "seed"], "policies": [[3, MANIFEST_ID, True],
                                                                                  [4, bytes(32), True]],
                                       "progress": {"stage": "long@12", "reward": 0.25, "step": 12}}), now=10.0)
    view.on_heartbeat("worker", beat({"roles": ["inference"], "policies": [[3, MANIFEST_ID, True],
                                                                           [4, bytes(32), False]]}), now=12.0)
    view.on_heartbeat(vid, beat({"roles": ["validator"]}), now=13.0)
    view.on_rollouts("worker", [group("worker", 3, [1.0, 0.0]), group("worker", 4, [0.5, 0.5])])
    view.on_rollouts("worker", [group("someone-else", 4, [1.0])])  # a group of another worker: refused
    rejected = sign_vote(validator.seed, b"r" * 32, False, [check("proof", True), check("reward", False, "fabricated")])
    accepted = sign_vote(validator.seed, b"a" * 32, True, [check("proof", True)])
    forged = sign_vote(impostor.seed, b"f" * 32, True, [check("proof", True)])  # impostor's vote sent by `vid`
    view.on_votes(vid, [rejected, accepted, forged], voter_of)
    report = view.report(now=15.0, window_s=5.0)
    rows = {r["peer"]: r for r in report["peers"]}
    assert rows["trainer"]["roles"] == ["trainer", "seed"] and rows["trainer"]["holds"] == [3, 4]
    # what a peer says of its progress, the known fields in reading order
    assert list(rows["trainer"]["progress"].items()) == [("step", 12), ("reward", 0.25), ("stage", "long@12")]
    assert rows["worker"]["holds"] == [3] and rows["worker"]["fetching"] == [4]
    assert rows["worker"]["groups"] == 2 and rows["worker"]["claimed_mean_reward"] == 0.5
    assert rows[vid]["votes"] == {"accept": 1, "reject": 1} and rows[vid]["holds"] == []
    assert report["newest_version"] == 4 and report["groups_by_version"] == {"3": 1, "4": 1}
    assert report["rollouts_voted"] == 2 and report["rollouts_with_a_rejecting_vote"] == 1
    assert report["rejecting_votes_by_check"] == {"reward": 1}
    assert report["refused_messages"] == 2  # the other worker's group, the forged vote
    text = render(report)
    assert "3 peers heard in 5 s; newest policy v4" in text and "fetching v4" in text
    assert (
        "step 12, reward 0.25, stage long@12" in text
        and "voted 1 accept / 1 reject" in text
        and "2 messages refused" in text
    )


@pytest.mark.parametrize(
    "body",
    [
        "not a dict",
        {"roles": ["validator"], "policies": [[-1, b"x", True], "junk"]},
        {"policies": 7},
        {"roles": "seed"},
        {"addrs": 5},
        {"policies": {"a": 1}},
        {"policies": [[True, bytes(32), 0]]},
        {"policies": [[1, bytes(32), False]] * 17},
        {"progress": {"nested": {"x": 1}}},
        {"progress": {"k" * 40: 1}},
        {"progress": {"note": "x" * 100}},
        {"progress": {"step": "1\r\nfake"}},
        {"roles": ["seed\n[trainer] step 9"]},
        {"addrs": ["/ip4/10.0.0.1/tcp/1/p2p/someone-else"]},
        {"roles": ["seed"], "extra": 1},
    ],
)
def test_a_heartbeat_a_handler_would_have_to_skip_is_refused_whole(body):
    """What the view or the node would have to ignore is refused at decode, so it is never forwarded either."""
    with pytest.raises(EnvelopeError) as refused:
        beat(body)
    assert refused.value.reason == "bad_body"


def test_the_json_report_is_strict_json_whatever_peers_claim():
    """A mean of huge claimed rewards overflows to infinity, which json.dumps prints as Infinity (not JSON)."""
    view = SwarmView()
    view.on_rollouts("w", [group("w", 1, [1e308, 1e308])])
    report = view.report(now=1.0, window_s=1.0)
    text = to_json(report)
    assert json.loads(text)["peers"][0]["claimed_mean_reward"] is None
    json.loads(text, parse_constant=lambda name: pytest.fail(f"{name} in the JSON report"))


async def test_an_observer_sees_the_peers_their_versions_and_votes_and_checks_the_manifest(tmp_path):
    trainer = Identity.generate()
    _, _, signed = signed_checkpoint(tmp_path, trainer, version=2, floats=30_000)
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            seed = await start_seeding(nursery, tmp_path, trainer, signed)
            validator = Peer(tmp_path, "validator", trainer, bootstrap=[seed.node.host.multiaddrs[0]],
                             roles=("validator",))
            nursery.start_soon(validator.run)
            await validator.ready.wait()

            async def vote_now_and_then():
                votes = [sign_vote(validator.identity.seed, os.urandom(32), False, [check("reward", False)])]
                while True:
                    await validator.node.gossip.publish("vote", vote_bodies(votes)[0])
                    await trio.sleep(0.5)

            nursery.start_soon(vote_now_and_then)
            report = await observe("t", (seed.node.host.multiaddrs[0],), 3.0, trainer.public_bytes)
            other_key = await observe("t", (seed.node.host.multiaddrs[0],), 1.5, Identity.generate().public_bytes)
            seed.stop()
            validator.stop()
            nursery.cancel_scope.cancel()
    rows = {r["peer"]: r for r in report["peers"]}
    assert rows[seed.node.peer_id]["holds"] == [2] and rows[validator.node.peer_id]["roles"] == ["validator"]
    assert rows[validator.node.peer_id]["votes"]["reject"] >= 1 and report["rejecting_votes_by_check"]["reward"] >= 1
    assert report["newest_version"] == 2 and report["manifest"]["version"] == 2
    assert report["manifest"]["signature"] == "signed by the run's trainer key"
    assert report["manifest"]["group_size"] == 4 and report["manifest"]["task"] == "?"  # not a swarm trainer's
    assert other_key["manifest"]["signature"].startswith("REFUSED")  # checked against the key given, not its own


def test_a_peer_keeps_its_roles_latest_milestones_for_its_heartbeats():
    from swarm.node.gossip import heartbeat_body as _heartbeat_body
    from swarm.node.node import Node

    node = Node(config=SimpleNamespace(peer=SimpleNamespace(roles=("trainer",))),
                host=SimpleNamespace(multiaddrs=["/ip4/127.0.0.1/tcp/1"]),
                gossip=None, mirror=SimpleNamespace(policies={}), events=None, nursery=None)
    assert "progress" not in _heartbeat_body(node)
    for event in (TrainStep(step=3, reward=0.5, stage="short@4", groups=4), Generated(version=2, groups=4),
                  Generated(version=3, groups=4), Validated(checked=8, accepted=6, rejected=2), Published(version=3)):
        node.note_progress(Emitted(event, 0.0))
    assert _heartbeat_body(node)["progress"] == {"step": 3, "reward": 0.5, "stage": "short@4", "groups_sent": 8,
                                                 "answered": 3, "checked": 8, "accepted": 6, "rejected": 2}


def test_the_simulation_says_how_to_watch_it(capsys):
    from swarm.cli.sim import _narrate

    _narrate(Emitted(Listening(peer_id="x", addrs=["/ip4/127.0.0.1/tcp/4001/p2p/12D3KooWx"], roles=[]), 0.0, "trainer"))
    _narrate(Emitted(Listening(peer_id="y", addrs=["/ip4/127.0.0.1/tcp/4002/p2p/12D3KooWy"], roles=[]), 0.0,
                     "validator0"))
    lines = capsys.readouterr().out.splitlines()
    assert lines == ["[trainer] listening on /ip4/127.0.0.1/tcp/4001/p2p/12D3KooWx (watch the run from another "
                     "shell: swarm status --run sim --bootstrap /ip4/127.0.0.1/tcp/4001/p2p/12D3KooWx)"]


def test_the_view_says_when_the_newest_manifest_was_not_had_or_not_signed_by_the_run():
    view = SwarmView()
    view.on_heartbeat("liar", beat({"roles": ["seed"], "policies": [[10**9, bytes(32), True]]}), now=1.0)
    report = view.report(now=2.0, window_s=1.0)
    assert "no peer holding v1000000000 answered with its manifest" in render({**report, "manifest": None})
    refused = {"version": 10**9, "signature": "REFUSED: the manifest is not signed by the run's trainer key"}
    assert "v1000000000: manifest REFUSED: the manifest is not signed" in render({**report, "manifest": refused})


def test_a_liars_manifest_id_or_terminal_escapes_do_not_win_the_view():
    """The first heartbeat to name a version's manifest id does not win it, and a peer's newlines and escapes in
    its roles or progress draw no fake lines in the status table."""
    real, bogus = b"\x01" * 32, b"\x02" * 32
    view = SwarmView()
    view.on_heartbeat("liar", beat({"roles": ["seed"], "policies": [[5, bogus, True]]}), now=1.0)
    for peer in ("a", "b"):
        view.on_heartbeat(peer, beat({"roles": ["seed"], "policies": [[5, real, True]]}), now=1.0)
    assert view.versions == {5: real}
    for escapes in ({"roles": ["seed\n[trainer] step 999", "\x1b[2Jx"]}, {"progress": {"step": "1\r\nfake"}}):
        with pytest.raises(EnvelopeError):
            beat(escapes)
    assert "fake" not in render(view.report(now=2.0, window_s=1.0))


async def test_no_peer_input_ends_the_observer_and_its_report_stays_strict_json(tmp_path, monkeypatch):
    """Fault injection at the observer's boundaries: every heartbeat makes the view raise, and the newest
    manifest's check raises (as for a manifest with a field of the wrong type). The observer
    still returns its report, and the report is strict JSON."""
    import swarm.cli.status as cmd_status

    def broken_view(self, sender, beat, now):
        raise RuntimeError("injected fault in the heartbeat view")

    async def broken_manifest(host, view, version, trainer_key):
        raise TypeError("injected: a tensor entry's shape is a string")

    trainer = Identity.generate()
    _, _, signed = signed_checkpoint(tmp_path, trainer, version=2, floats=30_000)
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            seed = await start_seeding(nursery, tmp_path, trainer, signed)
            monkeypatch.setattr(SwarmView, "on_heartbeat", broken_view)
            faulty = await observe("t", (seed.node.host.multiaddrs[0],), 2.0, trainer.public_bytes)
            monkeypatch.undo()
            monkeypatch.setattr(cmd_status, "_newest_manifest", broken_manifest)
            refused = await observe("t", (seed.node.host.multiaddrs[0],), 2.0, trainer.public_bytes)
            seed.stop()
            nursery.cancel_scope.cancel()
    assert faulty["peers"] == [] and faulty["refused_messages"] >= 1  # each heartbeat dropped, none ended it
    assert refused["manifest"]["signature"].startswith("REFUSED: TypeError")
    for each in (faulty, refused):
        json.loads(to_json(each), parse_constant=lambda name: pytest.fail(name))
