"""tasks/: built-in and user task sets, splits, FastCuRL segments and cached offline difficulty filtering."""

import json

import pytest

from tasks import (
    DifficultyBand,
    TaskError,
    estimate_solve_rates,
    filter_by_solve_rate,
    load_tasks,
    mean_prompt_length,
    render_prompt_text,
    segment,
)


@pytest.fixture(scope="module")
def arithmetic():
    return load_tasks("basic_arithmetic", size=40, seed=3)


def test_builtin_tasks_are_seeded_and_carry_their_scorer(arithmetic):
    again = load_tasks("basic_arithmetic", size=40, seed=3)
    other = load_tasks("basic_arithmetic", size=40, seed=4)
    assert len(arithmetic) == 40 and arithmetic.indices() == list(range(40))
    assert [e.prompt for e in arithmetic] == [e.prompt for e in again]
    assert [e.prompt for e in arithmetic] != [e.prompt for e in other]
    entry = arithmetic[7]
    assert entry.index == 7 and entry.dataset == "basic_arithmetic" and entry.reward_fn == "rg:basic_arithmetic"
    wire = entry.to_dict()
    assert wire["question"] == entry.prompt and wire["answer"] == entry.answer and "expression" in wire["metadata"]


@pytest.mark.parametrize("name", ["chain_sum", "countdown"])
def test_other_builtin_tasks_load(name):
    ts = load_tasks(name, size=5, seed=0)
    assert len(ts) == 5 and all(e.answer for e in ts)


def test_difficulty_is_configurable():
    easy = load_tasks("chain_sum", size=20, seed=1, config={"min_terms": 2, "max_terms": 2, "max_digits": 1})
    hard = load_tasks(
        "chain_sum", size=20, seed=1, config={"min_terms": 5, "max_terms": 5, "min_digits": 3, "max_digits": 3}
    )
    assert all(e.metadata["num_terms"] == 2 for e in easy) and all(e.metadata["num_terms"] == 5 for e in hard)
    assert mean_prompt_length(hard) > mean_prompt_length(easy)
    assert hard.spec["config"]["max_terms"] == 5


def test_a_config_scorer_replaces_the_lenient_substring_credit(arithmetic):
    from verify.rewards import compute_reward

    strict = load_tasks("basic_arithmetic", size=40, seed=3, config={"scorer": "numeric"})
    assert [e.prompt for e in strict] == [e.prompt for e in arithmetic]
    assert all(e.reward_fn == "numeric" for e in strict) and strict.spec["config"]["scorer"] == "numeric"
    assert "scorer" not in arithmetic.spec["config"]
    entry = next(e for e in strict if len(e.answer) >= 2 and not e.answer.startswith("-"))
    padded = f"= {entry.answer}0"  # the reference answer is a substring: reasoning-gym pays partial credit
    assert 0 < compute_reward(arithmetic[entry.index].reward_fn, padded, arithmetic[entry.index].to_dict()) < 1
    assert compute_reward(entry.reward_fn, padded, entry.to_dict()) == 0.0
    assert compute_reward(entry.reward_fn, f"so it is {entry.answer}.", entry.to_dict()) == 1.0
    with pytest.raises(TaskError, match="unknown scorer 'fuzzy'"):
        load_tasks("basic_arithmetic", size=3, config={"scorer": "fuzzy"})


def test_unknown_task_and_bad_config_are_one_clear_error():
    with pytest.raises(TaskError, match="unknown task 'no_such_task'"):
        load_tasks("no_such_task", size=3)
    with pytest.raises(TaskError, match="rejects config"):
        load_tasks("chain_sum", size=3, config={"no_such_knob": 1})


def test_split_is_seeded_disjoint_and_complete(arithmetic):
    train, held = arithmetic.split(0.25, seed=9)
    assert len(held) >= 10 and len(train) + len(held) == 40
    assert set(train.indices()).isdisjoint(held.indices())
    assert set(train.indices()) | set(held.indices()) == set(range(40))
    assert held.indices() == arithmetic.split(0.25, seed=9)[1].indices()
    assert held.indices() != arithmetic.split(0.25, seed=10)[1].indices()
    i = held.indices()[0]
    assert held[i] is arithmetic[i] and i not in train
    with pytest.raises(KeyError):
        train[i]


def test_split_holds_out_whole_questions_so_no_held_out_text_is_trained_on():
    from tasks.taskset import TaskEntry, TaskSet

    texts = ["What is 1+1?", "What is 2+2?", "What is 3+3?", "What is 4+4?"]
    entries = [TaskEntry("dup", i, texts[i % 4] + (" " if i % 3 == 0 else ""), "x") for i in range(40)]
    tasks = TaskSet("dup", entries)
    for seed in range(5):
        train, held = tasks.split(0.3, seed=seed)
        assert len(held) >= 12 and len(train) + len(held) == 40
        assert {e.prompt.strip() for e in train}.isdisjoint({e.prompt.strip() for e in held})


def test_segments_cut_at_the_mean_prompt_length(arithmetic):
    train, _ = arithmetic.split(0.2, seed=0)
    mean = mean_prompt_length(train)
    short, long_ = segment(train, "short"), segment(train, "long")
    assert short and long_ and sorted(short + long_) == segment(train, "all") == train.indices()
    assert all(len(train[i].prompt) <= mean for i in short) and all(len(train[i].prompt) > mean for i in long_)
    with pytest.raises(TaskError, match="unknown data segment"):
        segment(train, "medium")


def test_jsonl_user_dataset(tmp_path):
    path = tmp_path / "mine.jsonl"
    rows = [{"prompt": "What is 2+2?", "answer": 4}, {"prompt": "Capital of France?", "answer": "Paris",
                                                        "metadata": {"kind": "geo"}}]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    ts = load_tasks(str(path))
    assert ts.name == "mine" and len(ts) == 2
    assert ts[0].answer == "4" and ts[1].metadata == {"kind": "geo"} and ts[1].reward_fn == "math"
    assert render_prompt_text(ts[0]).startswith("What is 2+2?") and "Answer:" in render_prompt_text(ts[0])


def test_user_dataset_errors_name_file_and_column(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "x", "answer": "1"}\n{"prompt": "y"}\n')
    with pytest.raises(TaskError, match=r"bad\.jsonl row 1 has no 'answer' column"):
        load_tasks(str(bad))
    broken = tmp_path / "broken.jsonl"
    broken.write_text('{"prompt": "x", "answer": \n')
    with pytest.raises(TaskError, match=r"broken\.jsonl line 1 is not valid JSON"):
        load_tasks(str(broken))
    with pytest.raises(TaskError, match="does not exist"):
        load_tasks(str(tmp_path / "missing.jsonl"))


def test_parquet_files_load_like_jsonl(tmp_path):
    """The same rows as a parquet file (metadata as a struct column) give the same task set as JSONL."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [{"prompt": "What is 2+3?", "answer": "5", "metadata": {"level": 1}},
            {"prompt": "What is 7*6?", "answer": "42", "metadata": {"level": 2}}]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "sums.parquet")
    (tmp_path / "sums.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    from_parquet, from_jsonl = load_tasks(str(tmp_path / "sums.parquet")), load_tasks(str(tmp_path / "sums.jsonl"))
    assert [e.to_dict() for e in from_parquet] == [e.to_dict() for e in from_jsonl]
    assert from_parquet[1].answer == "42" and from_parquet[1].metadata == {"level": 2}


def test_bad_parquet_files_are_one_clear_error(tmp_path, monkeypatch):
    import sys

    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist([{"prompt": "x"}]), tmp_path / "noanswer.parquet")
    with pytest.raises(TaskError, match=r"noanswer\.parquet row 0 has no 'answer' column"):
        load_tasks(str(tmp_path / "noanswer.parquet"))
    garbage = tmp_path / "data.parquet"
    garbage.write_bytes(b"PAR1 not really")
    with pytest.raises(TaskError, match="not a readable parquet file"):
        load_tasks(str(garbage))
    monkeypatch.setitem(sys.modules, "pyarrow.parquet", None)  # an environment without pyarrow
    with pytest.raises(TaskError, match="needs pyarrow, which is not installed"):
        load_tasks(str(garbage))


def test_difficulty_filter_keeps_the_band_and_caches(tmp_path, arithmetic):
    calls = []

    def estimate(entries):  # a stand-in policy whose solve rate is a known function of the index
        calls.append([e.index for e in entries])
        return [(e.index % 10) / 10 for e in entries]

    cache = tmp_path / "rates.json"
    kept = filter_by_solve_rate(arithmetic, estimate, model_id="tiny@abc", samples=4, cache_path=cache)
    assert kept.indices() == [i for i in range(40) if 1 <= i % 10 <= 8]
    again = filter_by_solve_rate(arithmetic, estimate, model_id="tiny@abc", samples=4, cache_path=cache,
                                 band=DifficultyBand(0.0, 0.2))
    assert len(calls) == 1 and again.indices() == [i for i in range(40) if i % 10 <= 2]
    estimate_solve_rates(arithmetic, estimate, model_id="other-model", samples=4, cache_path=cache)
    assert len(calls) == 2  # another model's estimates are never reused
    cache.write_text("{not json")
    with pytest.raises(TaskError, match="corrupt"):
        estimate_solve_rates(arithmetic, estimate, model_id="tiny@abc", samples=4, cache_path=cache)
