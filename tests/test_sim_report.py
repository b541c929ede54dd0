"""`swarm sim`: its report.html (the timeline read back from the events, the page drawn from it) and a real run,
which also shows the mission end to end (the trainer steps only on quorum-accepted groups, a cheater is voted down)."""

from __future__ import annotations

import json
import subprocess
import sys
from html.parser import HTMLParser

import pytest

from swarm.event_types import Complete, Dropped, Evaluated, Listening, Trained, TrainStep, WorkerBanned
from swarm.events import Emitted
from swarm.sim.report_html import render_html
from swarm.sim.run import summarize
from swarm.sim.timeline import timeline

pytestmark = pytest.mark.usefixtures("one_torch_thread")


class Page(HTMLParser):
    """What a browser would build from the page, reduced to what the tests look at."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict]] = []
        self.open: list[str] = []
        self.sections: list[str] = []
        self.text: list[str] = []
        self.feed(text)
        self.close()

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        self.tags.append((tag, attrs))
        if tag == "section":
            self.sections.append(attrs.get("id"))
        if tag != "meta":  # the one void tag of the page; self-closed ones come as handle_startendtag
            self.open.append(tag)

    def handle_startendtag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))

    def handle_endtag(self, tag):
        assert self.open and self.open[-1] == tag, f"</{tag}> closes <{self.open[-1] if self.open else None}>"
        self.open.pop()

    def handle_data(self, data):
        self.text.append(data)

    def all(self, tag: str, css_class: str | None = None) -> list[dict]:
        return [a for t, a in self.tags if t == tag and (css_class is None or a.get("class") == css_class)]


def events() -> list[Emitted]:
    """A small run as its peers report it: two steps, three held-out scores, v0 and v1 spreading, one ban."""
    return [
        Emitted(Listening(peer_id="T", addrs=[], roles=["trainer"]), 100.0, "trainer"),
        Emitted(Listening(peer_id="C", addrs=[], roles=["inference"]), 100.5, "cheater0"),
        Emitted(Complete(version=0, id="a0"), 101.0, "trainer"),
        Emitted(Complete(version=0, id="a0"), 102.0, "cheater0"),
        Emitted(Complete(version=0, id="a0"), 102.5, "cheater0"),  # a second report changes nothing
        Emitted(Evaluated(when="before", step=0, accuracy=0.1, n=8, message=""), 103.0, "trainer"),
        Emitted(WorkerBanned(worker="C", by="reputation", reason="</svg><script>alert(1)</script> & more"), 104.0,
                "trainer"),
        Emitted(TrainStep(step=0, reward=0.25, stage="s", groups=2, gate={"accepted": 3, "rejected": 4}), 105.0,
                "trainer"),
        Emitted(Complete(version=1, id="a1"), 106.0, "trainer"),
        Emitted(Dropped(version=0), 107.0, "trainer"),
        Emitted(TrainStep(step=1, reward=0.5, stage="s", groups=2, gate={"accepted": 5, "rejected": 4}), 108.0,
                "trainer"),
        Emitted(Evaluated(when="after", step=2, accuracy=0.4, n=8, message=""), 109.0, "trainer"),
    ]


def test_the_timeline_reads_steps_settlements_evaluations_versions_held_and_bans_from_the_events():
    line = timeline(events())
    assert line["ended_s"] == 9.0
    assert line["steps"] == [{"step": 0, "at_s": 5.0, "reward": 0.25, "groups": 2, "accepted": 3, "rejected": 4},
                             {"step": 1, "at_s": 8.0, "reward": 0.5, "groups": 2, "accepted": 2, "rejected": 0}]
    assert [(e["when"], e["step"], e["accuracy"]) for e in line["heldout"]] == [("before", 0, 0.1), ("after", 2, 0.4)]
    assert line["version_spread"] == {"0": {"trainer": [1.0, 7.0], "cheater0": [2.0, None]},
                                      "1": {"trainer": [6.0, None]}}
    [ban] = line["bans"]
    assert ban["peer"] == "cheater0" and ban["at_s"] == 4.0 and ban["by"] == "reputation"
    assert ban["reported_by"] == "trainer" and ban["reason"].startswith("</svg>")
    assert timeline([]) == {"ended_s": 0.0, "steps": [], "heldout": [], "version_spread": {}, "bans": []}


def test_the_page_draws_the_curves_bars_spans_and_ban_from_the_report_and_escapes_every_string():
    report = summarize(events(), {"timed_out": False, "wall_s": 9.0})
    text = render_html(report)
    page = Page(text)
    assert page.sections == ["summary", "reward", "groups", "spread", "bans"] and not page.open
    assert "<script" not in text and "http" not in text.replace('xmlns="http://www.w3.org/2000/svg"', "")
    [reward] = page.all("path", "reward")
    [heldout] = page.all("path", "heldout")
    assert reward["data-values"] == "0.25,0.5" and reward["d"].count("L") == 1
    assert heldout["data-values"] == "0.1,0.4"
    assert [(r["data-step"], r["data-value"]) for r in page.all("rect", "accepted")] == [("0", "3"), ("1", "2")]
    assert [(r["data-step"], r["data-value"]) for r in page.all("rect", "rejected")] == [("0", "4"), ("1", "0")]
    held = {(r["data-version"], r["data-peer"]): (r["data-from"], r["data-until"]) for r in page.all("rect", "held")}
    assert held == {("0", "trainer"): ("1.0", "7.0"), ("0", "cheater0"): ("2.0", ""), ("1", "trainer"): ("6.0", "")}
    assert [line["data-at"] for line in page.all("line", "ban")] == ["4.0"]
    words = " ".join(page.text)
    assert "cheater0 (C) banned by trainer at 4.0 s (reputation): </svg><script>alert(1)</script> & more" in words


def test_the_held_out_curve_is_drawn_against_the_starting_score_and_the_constant_answer():
    trained = Emitted(Trained(steps=2, version=2, gate={}, banned=[], final="f",
                              heldout={"before": 0.1, "constant_answer": 0.05, "after": 0.4}), 110.0, "trainer")
    page = Page(render_html(summarize([*events(), trained], {"timed_out": False, "wall_s": 9.0})))
    [start] = page.all("line", "start")
    [constant] = page.all("line", "constant")
    assert (start["data-value"], constant["data-value"]) == ("0.1", "0.05")
    assert float(constant["y1"]) > float(start["y1"])  # lower on the chart: SVG's y grows downwards
    words = " ".join(page.text)
    assert "held-out accuracy before training: 0.100 (dashed)" in words
    assert "always the most frequent training answer: 0.050 (dashed)" in words


def test_a_run_with_no_step_and_no_ban_still_draws_a_page_that_says_so():
    text = render_html(summarize([], {"timed_out": True, "wall_s": 1.0}))
    page = Page(text)
    assert page.sections == ["summary", "reward", "groups", "spread", "bans"]
    assert "No step was trained." in text and "No worker was banned." in text and "TIMED OUT" in text


@pytest.mark.timeout(420)
def test_a_small_swarm_trains_only_on_quorum_accepted_rollouts_and_writes_report_html_beside_report_json(tmp_path):
    """`swarm sim` end to end, the mission in one process: policies travel as verified pieces, rollouts gossip, the
    validator votes, and the trainer steps only on quorum-accepted groups while the cheater's fabricated rewards
    are voted down; then the report, drawn. The shortest run that still shows all of it: one honest worker, one
    cheater, one validator, one seed-only peer, three steps. Three, not two: one honest worker's v0 groups fill
    steps 0 and 1 (2 prompts per step), so with two steps the run could end before the validator judged any of the
    cheater's groups; step 2 needs groups of v1 or newer, generated after the cheater's v0 groups had arrived."""
    out = tmp_path / "sim"
    result = subprocess.run([sys.executable, "-m", "swarm", "sim", "--out", str(out), "--steps", "3", "--inference",
                             "1", "--validators", "1", "--seeds", "1", "--cheaters", "1", "--eval-every", "2",
                             "--timeout", "300"], capture_output=True, text=True, timeout=400, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads((out / "report.json").read_text())
    events = [json.loads(line) for line in (out / "events.jsonl").read_text().splitlines()]
    _assert_trained_only_on_accepted_rollouts(report, events, out)
    _assert_the_page_draws_the_run(report, Page((out / "report.html").read_text()), result.stdout, out)


def _assert_trained_only_on_accepted_rollouts(report: dict, events: list[dict], out) -> None:
    assert not report["timed_out"]
    assert report["steps"] == 3 and report["versions_published"] >= 3
    # every rollout the cheater sent was refused by the validator for its fabricated reward
    cheater_ids = {e["peer_id"] for e in events if e["event"] == "listening" and e["peer"] == "cheater0"}
    assert report["rejection_reasons"].get("reward", 0) >= 1
    # the gate hands the trainer only groups inside the async window: no step is an empty, refused batch
    steps = [e for e in events if e["event"] == "train_step"]
    assert all(e["refused"] == 0 and e["reward"] is not None and e["groups"] >= 1 for e in steps)
    trained_workers = {w for e in steps for w in e.get("workers", [])}
    assert trained_workers and not (trained_workers & cheater_ids)
    # the seed-only peer mirrored at least the first version
    assert any(e["event"] == "complete" and e["peer"] == "seed0" for e in events)
    # the trainer scored its policy on the held-out split before its first step, every two steps, after its last
    evaluations = [e for e in events if e["event"] == "evaluated"]
    assert [(e["when"], e["step"]) for e in evaluations] == [("before", 0), ("during", 2), ("after", 3)]
    assert all(e["n"] == 64 and 0.0 <= e["accuracy"] <= 1.0 for e in evaluations)
    heldout = dict(report["heldout_accuracy"])
    assert 0.0 <= heldout.pop("constant_answer") <= 1.0  # the most-frequent-answer line beside the evaluations
    assert heldout == {e["when"]: e["accuracy"] for e in evaluations}
    assert (out / "trainer" / "training" / "eval.jsonl").read_text().count("\n") == 3


def _assert_the_page_draws_the_run(report: dict, page: Page, stdout: str, out) -> None:
    assert f"(pictures: {out / 'report.html'})" in stdout
    assert page.sections == ["summary", "reward", "groups", "spread", "bans"] and not page.open
    line = report["timeline"]
    [reward] = page.all("path", "reward")
    assert reward["data-values"] == ",".join(f"{s['reward']:g}" for s in line["steps"])
    assert [float(v) for v in reward["data-values"].split(",")] == pytest.approx(report["rewards"], abs=1e-3)
    assert [int(r["data-value"]) for r in page.all("rect", "accepted")] == [s["accepted"] for s in line["steps"]]
    assert sum(int(r["data-value"]) for r in page.all("rect", "rejected")) >= 1  # the cheater's groups
    assert [e["when"] for e in line["heldout"]] == ["before", "during", "after"]
    assert len(page.all("path", "heldout")) == 1
    held = {(r["data-version"], r["data-peer"]) for r in page.all("rect", "held")}
    for peer in ("trainer", "inference0", "validator0", "cheater0", "seed0"):
        assert ("0", peer) in held  # the first version reached every peer
    assert {v for v, _ in held} >= {"0", "1", "2"}
    # the cheater's ban: who, when, why, as the trainer reported it, and the same worker the report names
    bans = [b for b in line["bans"] if b["by"] == "reputation"]
    assert [b["peer"] for b in bans] == ["cheater0"] and [b["worker"] for b in bans] == report["banned_workers"]
    assert "quorum rejected its rollouts" in bans[0]["reason"] and 0 < bans[0]["at_s"] <= line["ended_s"]
    assert [float(b["data-at"]) for b in page.all("li", "ban")] == [b["at_s"] for b in line["bans"]]
    assert f"banned worker {bans[0]['worker']} (reputation)" in stdout


def test_a_negative_evaluation_interval_is_one_line_before_any_peer_starts(tmp_path, capsys):
    from swarm.cli.main import main

    assert main(["sim", "--out", str(tmp_path / "sim"), "--eval-every", "-1"]) == 2
    assert "--eval-every must be 0 or more steps, got -1" in capsys.readouterr().err
    assert not (tmp_path / "sim").exists()
