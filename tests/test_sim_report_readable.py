"""report.html and the simulation's progress lines read as words and round numbers: no Python dicts, no cut peer
names, no keys covering points, no garbled bytes."""

from __future__ import annotations

from swarm.event_types import TrainStep
from swarm.readable import readable_counts, readable_lags, readable_text
from swarm.sim.report_html import _ticks, render_html
from swarm.sim.run import summarize
from tests.test_sim_report import Page, events


def page_of(extra: dict | None = None) -> tuple[str, Page]:
    report = summarize(events(), {"timed_out": False, "wall_s": 9.0})
    report.update(extra or {})
    text = render_html(report)
    return text, Page(text)


def test_the_summary_names_each_evaluation_and_rejection_reason_in_words():
    text, _ = page_of({"heldout_accuracy": {"after": 0.4, "before": 0.1, "constant_answer": 0.25},
                       "rejection_reasons": {"reward": 3, "toploc": 1}})
    assert "before training 0.100, after 0.400, always the most frequent training answer 0.250" in text
    assert "(reward 3, toploc 1)" in text and "{" not in text.split("<body>")[1].split("<svg")[0]


def test_peer_names_are_drawn_whole_inside_the_picture():
    report = summarize(events(), {"timed_out": False, "wall_s": 9.0})
    spread = report["timeline"]["version_spread"]
    spread["0"]["validator10"] = (1.0, None)
    page = Page(render_html(report))
    labels = [a for t, a in page.tags if t == "text" and a.get("text-anchor") == "end"]
    assert "validator10" in page.text and all(float(a["x"]) >= 7 * len("validator10") for a in labels[-3:])


def test_every_version_colour_has_a_key_and_no_key_is_drawn_over_a_chart():
    _, page = page_of()
    keys = [t for t in page.text if t in ("v0", "v1")]
    assert keys == ["v0", "v1"]
    assert not [a for t, a in page.tags if t == "text" and a.get("class") == "legend"]  # none inside an <svg>
    assert len(page.all("p", "legend")) == 3


def test_axis_ticks_are_round_numbers():
    assert _ticks(0.0, 24.7) == [0, 5, 10, 15, 20]
    assert _ticks(0.0, 1.0) == [0, 0.25, 0.5, 0.75, 1]
    assert _ticks(0, 3, 4) == [0, 1, 2, 3]
    assert _ticks(2.0, 2.0) == [2.0]


def test_a_step_line_shows_model_text_and_counters_readably():
    line = TrainStep(step=3, reward=0.5, groups=4, trained_groups=2, lags={0: 4}, mean_tokens=5.0, hit_length=0,
                     completions=16, stage="short", refused=0, sample="+\ufffd\ufffd2\x07\nok").line()
    assert 'lags: 4 at lag 0' in line and 'best: "+??2⏎ok"' in line and "{" not in line


def test_counters_and_lags_read_as_words():
    assert readable_counts({"refused:stale": 1, "accepted": 3}) == "accepted 3, refused: stale 1"
    assert readable_counts({}) == "none" and readable_lags({1: 2, 0: 4}) == "4 at lag 0, 2 at lag 1"
    assert readable_text("x" * 100, limit=4) == '"xxxx…"'
