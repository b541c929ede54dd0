"""Rewards: the extraction rule, each registry entry, and hostile completions (fuzzed) that must never raise."""

from __future__ import annotations

import threading

import pytest
import reasoning_gym
from hypothesis import given, settings
from hypothesis import strategies as st

from verify.reward_fns import extract_answer, is_known, parse_number
from verify.rewards import compute_reward


@pytest.mark.parametrize("text,answer", [
    ("so the sum is \\boxed{42}. Answer: 7", "42"),
    ("\\boxed{\\frac{1}{2}} then \\boxed{x^{2}}", "x^{2}"),
    ("thinking 3 4 5\nAnswer: -12\nbye", "-12"),
    ("ANSWER:  1,234.5", "1,234.5"),
    ("we get 3, then 4, finally 7/2", "7/2"),
    ("no digits here\n\nlast line  ", "last line"),
    ("", ""),
    ("\\boxed{unclosed 5", "5"),
])
def test_extraction_rule(text, answer):
    assert extract_answer(text) == answer


def test_parse_number_is_exact():
    assert parse_number("1,234") == 1234 and parse_number("7/2") == parse_number("3.5")
    assert parse_number("$12.") == 12 and parse_number("1/0") is None and parse_number("abc") is None


def test_registry_functions_score_right_and_wrong_answers():
    entry = {"prompt": "What is 6 * 7?", "answer": "42", "metadata": {}}
    assert compute_reward("exact", "Answer: 42", entry) == 1.0
    assert compute_reward("exact", "Answer: 41", entry) == 0.0
    assert compute_reward("numeric", "\\boxed{42.0000000001}", entry) == 1.0
    assert compute_reward("numeric", "\\boxed{42.1}", entry) == 0.0
    assert compute_reward("math", "\\boxed{\\frac{84}{2}}", entry) == 1.0
    assert compute_reward("math", "\\boxed{43}", entry) == 0.0
    assert compute_reward("no-such-fn", "42", entry) == 0.0
    assert is_known("rg:basic_arithmetic") and not is_known("rg:not_a_dataset") and not is_known("nope")


def test_reasoning_gym_scorer_is_the_datasets_own():
    data = reasoning_gym.create_dataset("basic_arithmetic", size=5, seed=3)
    for i in range(5):
        item = data[i]
        entry = {"prompt": item["question"], "answer": item["answer"], "metadata": item["metadata"]}
        assert compute_reward("rg:basic_arithmetic", f"I think\nAnswer: {item['answer']}", entry) == 1.0
        wrong = str(int(float(item["answer"])) + 1)
        assert compute_reward("rg:basic_arithmetic", f"Answer: {wrong}", entry) == 0.0


def test_math_reward_is_safe_outside_the_main_thread():
    results = []
    thread = threading.Thread(target=lambda: results.append(compute_reward("math", "\\boxed{0.5}", {"answer": "1/2"})))
    thread.start()
    thread.join()
    assert results == [1.0]


HOSTILE = st.one_of(
    st.text(max_size=300),
    st.text(alphabet="\\{}boxed^_0123456789/.,-+ $Answer:\n()[]frac", max_size=300),
    st.sampled_from(["\\boxed{" * 200, "}" * 500 + "\\boxed{", "Answer: " + "9" * 5000, "1/" * 400 + "0",
                     "\\boxed{\\frac{1}{0}}", "\\boxed{10^{10^{10^{10}}}}", "\x00\ud7ff" * 50, "nan", "inf"]),
)


@settings(max_examples=60, deadline=None)
@given(text=HOSTILE, fn=st.sampled_from(["exact", "numeric", "math", "rg:basic_arithmetic", "rg:chain_sum"]))
def test_hostile_completions_never_raise_and_stay_in_range(text, fn):
    entry = {"prompt": "Calculate 2 + 2.", "answer": "4", "metadata": {}}
    value = compute_reward(fn, text, entry)
    assert isinstance(value, float) and 0.0 <= value <= 1.0


@pytest.mark.parametrize("entry", [None, {}, {"answer": None}, {"answer": ["x"], "metadata": "bad"}])
def test_hostile_entries_never_raise(entry):
    for fn in ("exact", "numeric", "math", "rg:basic_arithmetic"):
        assert compute_reward(fn, "Answer: 4", entry) in (0.0, 1.0)


def test_a_scorer_past_its_deadline_is_killed_and_replaced():
    from verify.rewards import _ScorerWorker

    worker = _ScorerWorker(timeout_s=0.3)
    try:
        assert worker.score("math", "\\boxed{4}", {"answer": "4"}) == 1.0
        first = worker._process.pid
        # sympy spends about a second (math-verify's own limit) on this tower before giving up
        assert worker.score("math", "\\boxed{10^{10^{10^{10}}}}", {"answer": "4"}) == 0.0
        assert worker._process is None
        assert worker.score("math", "\\boxed{4}", {"answer": "4"}) == 1.0 and worker._process.pid != first
    finally:
        worker._stop()


def test_groups_are_scored_in_one_round_trip_and_a_hanging_completion_or_group_costs_only_itself():
    """One worker through both (each scorer it replaces is a process start): a group's completions in one round
    trip, a hanging completion that zeroes only itself, many groups in one round trip, a hanging group that costs
    only itself."""
    from verify.rewards import _ScorerWorker

    worker = _ScorerWorker(timeout_s=0.3)
    exchanges = []
    exchange = worker._exchange
    worker._exchange = lambda jobs: exchanges.append(len(jobs)) or exchange(jobs)
    tower = "\\boxed{10^{10^{10^{10}}}}"  # misses the deadline: sympy spends about a second on it
    try:
        four, five = {"answer": "4"}, {"answer": "5"}
        assert worker.score_many("math", ["\\boxed{4}", "\\boxed{5}", "it is 4"], four) == [1.0, 0.0, 1.0]
        assert exchanges == [1]
        first = worker._process.pid
        # the batch misses its deadline and is rescored one at a time: the completion after the tower still scores
        assert worker.score_many("math", ["\\boxed{4}", tower, "\\boxed{2+2}"], four) == [1.0, 0.0, 1.0]
        assert worker._process.pid != first
        exchanges.clear()
        jobs = [("math", ["\\boxed{4}", "\\boxed{5}"], four), ("math", ["\\boxed{5}"], five), ("math", ["4"], five)]
        assert worker.score_jobs(jobs) == [[1.0, 0.0], [1.0], [0.0]] and exchanges == [3]
        exchanges.clear()  # the batch misses its deadline: each group is scored on its own
        assert worker.score_jobs([("math", ["\\boxed{4}"], four), ("math", ["\\boxed{5}", tower], five)]) == [
            [1.0], [1.0, 0.0]]
        assert exchanges[:3] == [2, 1, 1]  # the batch, then the honest group alone, then the hanging one alone
    finally:
        worker._stop()


def test_compute_rewards_matches_compute_reward_and_survives_hostile_items():
    from verify.rewards import compute_reward, compute_rewards

    entry = {"question": "Calculate 6 * 10.", "answer": "60", "metadata": {}}
    texts = ["6 * 10 = 60", "6 * 10 = 600", "", "Answer: 60", None]
    for fn in ("numeric", "rg:basic_arithmetic", "nope"):
        got = compute_rewards(fn, texts, entry)
        assert got == [compute_reward(fn, t, entry) for t in texts] and got[-1] == 0.0
    assert compute_rewards("numeric", texts, None) == [0.0] * 5 and compute_rewards("numeric", [], entry) == []


def test_compute_rewards_many_equals_compute_rewards_job_by_job():
    from verify.rewards import compute_rewards, compute_rewards_many

    arithmetic = {"question": "Calculate 6 * 10.", "answer": "60", "metadata": {}}
    jobs = [("numeric", ["60", "600", None], arithmetic), ("rg:basic_arithmetic", ["Answer: 60", "61"], arithmetic),
            ("nope", ["60"], arithmetic), ("exact", ["60"], None), ("rg:basic_arithmetic", [], arithmetic),
            ("math", ["\\boxed{60}"], arithmetic)]
    assert compute_rewards_many(jobs) == [compute_rewards(*job) for job in jobs]
    assert compute_rewards_many(jobs)[:2] == [[1.0, 0.0, 0.0], [1.0, 0.0]]


def _report_scorer_state(queue) -> None:
    from verify.rewards import _SCORER

    queue.put((_SCORER._process is None, _SCORER.score("math", "\\boxed{4}", {"answer": "4"})))


def test_started_scorer_is_launched_early_and_a_forked_child_starts_its_own():
    """start_scorer launches without waiting; a forked process (the local generator) never writes into the parent's
    scorer pipes but starts a scorer of its own, and the parent's keeps working."""
    import multiprocessing

    from verify.rewards import _SCORER, start_scorer

    start_scorer({"exact"})  # in-process scorers need no scorer process
    start_scorer({"exact", "math"})
    assert _SCORER._process is not None and _SCORER._process.poll() is None
    parent_pid = _SCORER._process.pid
    ctx = multiprocessing.get_context("fork")
    queue = ctx.Queue()
    child = ctx.Process(target=_report_scorer_state, args=(queue,))
    child.start()
    try:
        assert queue.get(timeout=60) == (True, 1.0)
    finally:
        child.join(30)
    assert child.exitcode == 0
    assert compute_reward("math", "\\boxed{4}", {"answer": "4"}) == 1.0 and _SCORER._process.pid == parent_pid


_FORKED_SCORER_SCRIPT = r"""
from verify.rewards import _ScorerWorker
from verify.scorer_worker import ForkedScorer

worker = _ScorerWorker(timeout_s=0.3)
assert worker.score_many("math", ["\\boxed{4}", "\\boxed{5}"], {"answer": "4"}) == [1.0, 0.0]
assert isinstance(worker._process, ForkedScorer), type(worker._process)
first = worker._process.pid
assert worker.score("math", "\\boxed{10^{10^{10^{10}}}}", {"answer": "4"}) == 0.0  # past the deadline: killed
assert worker._process is None
assert worker.score("math", "\\boxed{4}", {"answer": "4"}) == 1.0 and worker._process.pid != first
worker._process.stdin.close()  # end of input: the forked scorer exits by itself
assert worker._process.wait() == 0
print("OK")
"""


def test_a_single_threaded_process_forks_its_scorer_which_behaves_like_the_spawned_one():
    """Run in a fresh interpreter (one thread, so the fork path is taken): deadline, kill, replacement and a clean
    exit at end of input; nothing the scorer does reaches the caller's stdout."""
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    done = subprocess.run([sys.executable, "-c", _FORKED_SCORER_SCRIPT], cwd=root, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout == "OK\n"
