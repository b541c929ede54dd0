"""`swarm status --watch`: the live view's drawing, the view's throughput and bans, and the real command watching
an in-process peer (JSON lines through a pipe, a live table on a terminal) until Ctrl-C."""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import threading
from types import SimpleNamespace

import pytest
import trio
import trio.testing
from rich.console import Console

import swarm.cli.status_live as status_live
import swarm.cli.status_view as status
from p2p.identity import Identity, peer_id_from_public_bytes
from swarm.cli.status_live import live_renderable
from swarm.cli.status_view import SwarmView
from swarm.messages.gossip_bodies import decode_heartbeat
from tests.swarm.test_swarm_nodes import signed_checkpoint, start_seeding
from verify.votes import sign_vote, verify_vote

SWARM = [sys.executable, "-m", "swarm"]
WITHIN_S = 120  # a bound on a child's start and first refreshes on a busy 2-core machine, not a speed target


def beat(body: dict, sender: str):
    return decode_heartbeat(SimpleNamespace(sender_peer_id=sender, body=body))


def announced(worker: str, version: int, rollout_id: bytes):
    """A rollout item as the view sees an announcement: it names its worker, version and rollout id."""
    return SimpleNamespace(worker=worker, policy_version=version, rollout_id=rollout_id, completions=())


def voter_of(vote):
    return peer_id_from_public_bytes(vote.validator) if verify_vote(vote) else None


def check(name, ok):
    return SimpleNamespace(name=name, ok=ok, reason="")


def vote(validator: Identity, rollout_id: bytes, accept: bool):
    return sign_vote(validator.seed, rollout_id, accept, [check("reward", accept)])


def judged_view() -> tuple[SwarmView, Identity, Identity]:
    """A cheater whose four rollouts both validators reject, an honest worker whose rollouts they accept except
    for one validator's lone rejection (a tie), and a peer whose role is markup."""
    one, two = Identity.generate(), Identity.generate()
    view = SwarmView()
    view.on_heartbeat("cheater", beat({"roles": ["inference"], "policies": [[3, bytes(32), True]]}, "cheater"), 1.0)
    view.on_heartbeat("honest", beat({"roles": ["inference"], "policies": [[3, bytes(32), True]]}, "honest"), 1.0)
    view.on_heartbeat("marked", beat({"roles": ["[blink]trainer"], "progress": {"step": 7}}, "marked"), 1.0)
    for i in range(4):
        view.on_rollouts("cheater", [announced("cheater", 3, b"c%d" % i + bytes(30))], now=10.0 + i)
        view.on_rollouts("honest", [announced("honest", 3, b"h%d" % i + bytes(30))], now=10.0 + i)
        for validator in (one, two):
            view.on_votes(validator.peer_id, [vote(validator, b"c%d" % i + bytes(30), False)], voter_of, now=20.0)
        view.on_votes(one.peer_id, [vote(one, b"h%d" % i + bytes(30), True)], voter_of, now=20.0)
        view.on_votes(two.peer_id, [vote(two, b"h%d" % i + bytes(30), i != 0)], voter_of, now=20.0)
    view.on_votes(one.peer_id, [vote(one, b"h9" + bytes(30), False)], voter_of, now=20.0)  # a rollout never heard
    return view, one, two


def test_the_view_bans_by_the_reputation_rule_on_the_majority_of_votes_heard_and_counts_throughput():
    view, one, _ = judged_view()
    report = view.report(now=40.0, window_s=40.0)
    rows = {r["peer"]: r for r in report["peers"]}
    assert rows["cheater"]["judged"] == {"accepted": 0, "rejected": 4} and rows["cheater"]["banned"]
    # the honest rollout one validator rejected and the other accepted is a tie: it counts for neither
    assert rows["honest"]["judged"] == {"accepted": 3, "rejected": 0} and "banned" not in rows["honest"]
    assert report["banned_workers"] == ["cheater"]
    # 8 groups and 17 votes in the last 40 s of watching (the window is shorter than a minute)
    assert report["throughput"] == {"over_s": 40.0, "groups_per_min": 12.0, "votes_per_min": 25.5}
    assert view.report(now=95.0, window_s=95.0)["throughput"]["groups_per_min"] == 0.0  # a minute later: none


def test_a_worker_is_banned_at_its_third_rejected_rollout_and_a_vote_on_an_unheard_rollout_judges_no_one():
    """verify.reputation: 1 off per rejection from 0, banned at -3 or below."""
    validator = Identity.generate()
    view = SwarmView()
    view.on_votes(validator.peer_id, [vote(validator, b"\xff" * 32, False)], voter_of, now=1.0)
    for i in range(3):
        assert view.judged_workers()[1] == []
        view.on_rollouts("w", [announced("w", 1, bytes([i]) * 32)], now=1.0)
        view.on_votes(validator.peer_id, [vote(validator, bytes([i]) * 32, False)], voter_of, now=1.0)
    assert view.judged_workers() == ({"w": {"accepted": 0, "rejected": 3}}, ["w"])


def test_what_the_view_keeps_per_rollout_is_bounded(monkeypatch):
    """A watch runs for days: rollout ids and verdicts beyond the bound are forgotten, oldest first."""
    monkeypatch.setattr(status, "MAX_ROLLOUTS_KEPT", 5)
    validator = Identity.generate()
    view = SwarmView()
    for i in range(12):
        rollout_id = bytes([i]) * 32
        view.on_rollouts("w", [announced("w", 1, rollout_id)], now=float(i))
        view.on_votes(validator.peer_id, [vote(validator, rollout_id, True)], voter_of, now=float(i))
    assert list(view.worker_of) == [bytes([i]) * 32 for i in range(7, 12)]
    assert len(view.verdicts) == 5 and view.judged_workers()[0] == {"w": {"accepted": 5, "rejected": 0}}


def test_the_live_drawing_shows_peers_roles_versions_throughput_votes_and_bans_and_draws_no_peer_markup():
    view, one, _ = judged_view()
    report = view.report(now=40.0, window_s=40.0)
    console = Console(file=io.StringIO(), width=200, record=True, color_system=None)
    console.print(live_renderable(report, refreshed_s=40.0))
    text = console.export_text()
    assert "5 peers heard, watching for 40 s; newest policy v3" in text  # 3 heartbeats, 2 voters
    assert "[blink]trainer" in text and "step 7" in text  # a peer's markup is drawn as its characters
    assert "0 accepted / 4 rejected BANNED" in text and "3 accepted / 0 rejected" in text
    assert one.peer_id[-16:] in text and "4 accept / 5 reject" in text
    assert "throughput over the last 40 s: 12 groups/min, 25.5 votes/min" in text
    assert "banned by the votes heard: cheater" in text
    assert "votes on 9 rollouts, 6 with a rejecting vote (failed checks: {'reward': 10})" in text


class Child:
    """The real `swarm status --watch` in a child process; its stdout read line by line in a thread."""

    def __init__(self, tmp_path, args: list[str], stdout=subprocess.PIPE) -> None:
        self.stderr_path = tmp_path / "stderr.txt"
        env = {**os.environ, "COLUMNS": "220", "LINES": "50"}
        with open(self.stderr_path, "w") as stderr:
            self.popen = subprocess.Popen([*SWARM, "status", *args], stdout=stdout, stderr=stderr, env=env)

    async def interrupt(self) -> tuple[int, str]:
        self.popen.send_signal(signal.SIGINT)
        try:
            status = await trio.to_thread.run_sync(self.popen.wait, 30)
        finally:
            self.popen.kill()
        return status, self.stderr_path.read_text()


async def read_until(read, done) -> str:
    """Read chunks with `read()` (in a thread) until `done(text so far)`; what was read."""
    text = ""
    while not done(text):
        chunk = await trio.to_thread.run_sync(read, abandon_on_cancel=True)
        if not chunk:
            pytest.fail(f"the command ended early: {text[-2000:]}")
        text += chunk
    return text


@pytest.mark.timeout(240)
async def test_watch_prints_one_json_line_per_refresh_through_a_pipe_and_ends_on_ctrl_c(tmp_path):
    trainer = Identity.generate()
    _, _, signed = signed_checkpoint(tmp_path, trainer, version=2, floats=30_000)
    with trio.fail_after(WITHIN_S * 2):
        async with trio.open_nursery() as nursery:
            seed = await start_seeding(nursery, tmp_path, trainer, signed)
            child = Child(tmp_path, ["--watch", "--every", "0.5", "--run", "t", "--trainer-key",
                                     trainer.public_bytes.hex(), "--bootstrap", seed.node.host.multiaddrs[0]])

            def seen_twice(text: str) -> bool:  # the manifest is fetched in the background: wait for it too
                return sum('"holds": [2]' in line and "signed by the run's trainer key" in line
                           for line in text.splitlines()) >= 2

            out = await read_until(lambda: child.popen.stdout.readline().decode(), seen_twice)
            code, stderr = await child.interrupt()
            seed.stop()
            nursery.cancel_scope.cancel()
    reports = [json.loads(line) for line in out.splitlines()]  # every line is one whole JSON report
    holding = [r for r in reports if any(p["holds"] == [2] for p in r["peers"])]
    assert holding[-1]["manifest"]["signature"] == "signed by the run's trainer key"
    assert holding[-1]["peers"][0]["peer"] == seed.node.peer_id and "throughput" in holding[-1]
    assert [r["window_s"] for r in reports] == sorted(r["window_s"] for r in reports)  # seconds watched, growing
    assert code == 130 and stderr.splitlines() == ["swarm: interrupted"], (code, stderr)


@pytest.mark.timeout(240)
async def test_watch_draws_a_live_table_on_a_terminal_and_ends_on_ctrl_c_in_one_line(tmp_path):
    trainer = Identity.generate()
    _, _, signed = signed_checkpoint(tmp_path, trainer, version=2, floats=30_000)
    main, terminal = os.openpty()
    with trio.fail_after(WITHIN_S * 2):
        async with trio.open_nursery() as nursery:
            seed = await start_seeding(nursery, tmp_path, trainer, signed)
            child = Child(tmp_path, ["--watch", "--every", "0.5", "--run", "t", "--bootstrap",
                                     seed.node.host.multiaddrs[0]], stdout=terminal)
            os.close(terminal)
            short_id = seed.node.peer_id[-16:]
            screen = await read_until(lambda: os.read(main, 65536).decode(errors="replace"),
                                      lambda text: short_id in text and "v2" in text)
            code, stderr = await child.interrupt()
            seed.stop()
            nursery.cancel_scope.cancel()
    threading.Thread(target=_drain, args=(main,), daemon=True).start()
    assert "\x1b[" in screen and "peers heard, watching for" in screen  # drawn for a terminal, not JSON
    assert not screen.lstrip().startswith("{")
    assert code == 130 and stderr.splitlines() == ["swarm: interrupted"], (code, stderr)


def _drain(fd: int) -> None:
    """Read what is left on the terminal's side until the child is gone, then close it."""
    try:
        while os.read(fd, 65536):
            pass
    except OSError:
        pass
    finally:
        os.close(fd)


async def test_a_watch_asks_for_the_newest_manifest_when_the_version_changes_or_its_holders_were_silent(monkeypatch):
    import swarm.cli.status as cmd_status

    asked: list[object] = []
    answers = {3: None, 4: {"version": 4, "signature": "signed by the run's trainer key"}}

    async def newest(host, view, report, trainer_key):
        asked.append(report["newest_version"])
        return {**report, "manifest": answers[report["newest_version"]]}

    monkeypatch.setattr(cmd_status, "_with_newest_manifest", newest)
    cache = cmd_status.NewestManifest(None)
    async with trio.open_nursery() as nursery:
        for version, now in ((3, 0.0), (3, 2.0), (3, cmd_status.MANIFEST_RETRY_S + 1), (4, 40.0), (4, 42.0),
                             (4, 500.0)):
            cache.refresh(nursery, None, None, {"newest_version": version}, now)
            await trio.testing.wait_all_tasks_blocked()
    assert asked == [3, 3, 4]  # v3 again only after the retry delay; v4, answered, never again
    assert cache.overlay({"newest_version": 4, "peers": []}) == {"newest_version": 4, "peers": [],
                                                                  "manifest": answers[4]}
    assert cache.overlay({"newest_version": 5}) == {"newest_version": 5}  # v4's manifest is not v5's


async def test_a_holder_slow_to_answer_does_not_hold_up_the_watch(monkeypatch):
    """While a fetch waits, refreshes go on without a manifest and start no second fetch."""
    import swarm.cli.status as cmd_status

    answered, asked = trio.Event(), []

    async def slow(host, view, report, trainer_key):
        asked.append(report["newest_version"])
        await answered.wait()
        return {**report, "manifest": {"version": 2}}

    monkeypatch.setattr(cmd_status, "_with_newest_manifest", slow)
    cache = cmd_status.NewestManifest(None)
    async with trio.open_nursery() as nursery:
        for now in (0.0, 1.0, 2.0):
            cache.refresh(nursery, None, None, {"newest_version": 2}, now)
            await trio.testing.wait_all_tasks_blocked()
            assert cache.overlay({"newest_version": 2}) == {"newest_version": 2}
        answered.set()
    assert asked == [2] and cache.overlay({"newest_version": 2})["manifest"] == {"version": 2}


def test_once_the_run_names_its_validators_a_crowd_of_other_voters_bans_no_one():
    """Any key can sign a vote: ten made-up voters rejecting an honest worker's rollouts outvote its one real
    validator, until a manifest checked against the run's key names the validators; then only theirs count. A
    voter repeating itself on one rollout counts once."""
    real, crowd = Identity.generate(), [Identity.generate() for _ in range(10)]
    view = SwarmView()
    for i in range(4):
        rollout_id = bytes([i]) * 32
        view.on_rollouts("honest", [announced("honest", 1, rollout_id)], now=1.0)
        view.on_votes(real.peer_id, [vote(real, rollout_id, True)], voter_of, now=1.0)
        for liar in crowd:
            for _ in range(2):
                view.on_votes(liar.peer_id, [vote(liar, rollout_id, False)], voter_of, now=1.0)
    assert view.judged_workers() == ({"honest": {"accepted": 0, "rejected": 4}}, ["honest"])
    view.run_validators = frozenset({real.peer_id})
    assert view.judged_workers() == ({"honest": {"accepted": 4, "rejected": 0}}, [])


def _busy_report() -> dict:
    """Four peers with long ids, several roles, versions held and fetched, and a full line of progress each."""
    view, _, _ = judged_view()
    report = view.report(now=40.0, window_s=40.0)
    for row in report["peers"]:
        row.update(peer=Identity.generate().peer_id, roles=["inference", "validator"], holds=[11, 12], fetching=[13],
                   progress={"step": 120, "reward": 0.53, "stage": "short@4", "groups_sent": 56, "answered": 3})
    return report


def test_the_live_drawing_fits_80_columns_with_every_column_header_whole():
    console = Console(file=io.StringIO(), width=80, record=True, color_system=None)
    report = _busy_report()
    console.print(live_renderable(report, refreshed_s=40.0))
    lines = console.export_text().splitlines()
    header = next(line for line in lines if line.startswith("peer "))
    assert [cell.strip() for cell in header.split("┃")] == list(status_live.NARROW_HEADERS)
    assert all(len(line) <= 80 for line in lines) and not any("…" in line for line in lines)
    peer = report["peers"][0]["peer"]
    assert f"{peer[-8:]}: step 120, reward 0.53, stage short@4, groups_sent 56, answered 3" in lines


def test_a_wide_terminal_keeps_the_wide_table_with_whole_headers():
    console = Console(file=io.StringIO(), width=200, record=True, color_system=None)
    console.print(live_renderable(_busy_report(), refreshed_s=40.0))
    header = next(line for line in console.export_text().splitlines() if line.startswith("peer "))
    assert [cell.strip() for cell in header.split("┃")] == [
        "peer", "roles", "holds", "heard", "progress", "groups heard", "votes", "its rollouts"]
