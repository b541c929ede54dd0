"""Task data as the ecosystem ships it: JSONL, JSON, parquet and CSV files with their own column names (GSM8K's
question/answer, chosen with --prompt-key/--answer-key or the trainer config's prompt_key/answer_key), and hub
datasets read from the local Hugging Face cache (ORG/NAME, hf://datasets/ORG/NAME/PATH), never downloaded."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from swarm.cli.main import main
from swarm.policy.task_file import snapshot_task_file
from tasks import TaskError, load_tasks
from tasks.hub_cache import parse_reference, write_snapshot

pytestmark = pytest.mark.usefixtures("one_torch_thread")

GSM8K_ROWS = [{"question": f"Ann has {i} apples and buys {i + 2} more. How many apples does she have?",
               "answer": f"She has {i} + {i + 2} = <<{i}+{i + 2}={2 * i + 2}>>{2 * i + 2} apples.\n#### {2 * i + 2}"}
              for i in range(1, 31)]
GSM8K_ROWS[0]["answer"] = "Ann counts them all.\n#### 1,204"  # thousands separators, as GSM8K writes them


@pytest.fixture(autouse=True)
def _model_cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("SWARM_MODEL_CACHE", str(tmp_path_factory.getbasetemp() / "model-cache"))


def _jsonl(rows) -> bytes:
    return "".join(json.dumps(row) + "\n" for row in rows).encode()


def _parquet(rows) -> bytes:
    sink = pa.BufferOutputStream()
    pq.write_table(pa.Table.from_pylist(rows), sink)
    return sink.getvalue().to_pybytes()


@pytest.fixture
def gsm8k_cache(tmp_path, monkeypatch) -> Path:
    """openai/gsm8k as the hub ships it: two subsets (main, socratic), each with train and test parquet shards."""
    cache = tmp_path / "hf-cache"
    files = {f"{subset}/{split}-0000{k}-of-00002.parquet": _parquet(GSM8K_ROWS[k::2])
             for subset in ("main", "socratic") for split in ("train", "test") for k in (0, 1)}
    write_snapshot(parse_reference("openai/gsm8k"), "dataset", {**files, "README.md": b"# gsm8k\n"}, cache)
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    return cache


def _one_line_refusal(capsys, argv) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    return err.strip()


def test_a_gsm8k_style_file_trains_with_its_question_column_and_its_final_answers(tmp_path, capsys):
    data = tmp_path / "gsm8k.jsonl"
    data.write_bytes(_jsonl(GSM8K_ROWS))
    line = _one_line_refusal(capsys, ["train", "--task", str(data), "--out", str(tmp_path / "refused")])
    assert f"task file {data} row 0 has no 'prompt' column (its columns: question, answer)" in line
    assert "--prompt-key" in line and not (tmp_path / "refused").exists()
    out = tmp_path / "run"
    assert main(["train", "--task", str(data), "--prompt-key", "question", "--steps", "1", "--curriculum", "none",
                 "--max-new-tokens", "2", "--prompts-per-step", "2", "--group-size", "2", "--eval-n", "4",
                 "--out", str(out), "--quiet"]) == 0
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["steps"] == 1
    tasks = load_tasks(str(data), prompt_key="question")
    assert [tasks[0].answer, tasks[1].answer] == ["1204", "6"] and tasks.name == "gsm8k"


def test_eval_reads_a_cached_hub_dataset_with_the_configs_column_mapping(gsm8k_cache, tmp_path, capsys):
    config = tmp_path / "gsm8k.toml"
    config.write_text('task = "hf://datasets/openai/gsm8k/main"\nprompt_key = "question"\n')
    assert main(["eval", "--config", str(config), "--n", "3", "--max-new-tokens", "2", "--json"]) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert result["task"] == "hf://datasets/openai/gsm8k/main" and result["n"] == 3


def test_a_hub_datasets_train_split_is_its_train_shards_in_order(gsm8k_cache):
    tasks = load_tasks("hf://datasets/openai/gsm8k/main", prompt_key="question")
    assert len(tasks) == 30 and tasks.name == "gsm8k"  # both train shards, not the test ones
    assert [tasks[i].prompt for i in range(2)] == [GSM8K_ROWS[0]["question"], GSM8K_ROWS[2]["question"]]
    assert tasks.spec["hub"] == "openai/gsm8k" and tasks.spec["commit"] == "0" * 40
    one_file = load_tasks("hf://datasets/openai/gsm8k/main/test-00001-of-00002.parquet", prompt_key="question")
    assert len(one_file) == 15 and one_file[0].prompt == GSM8K_ROWS[1]["question"]


@pytest.mark.parametrize("name, fragment", [
    ("openai/gsm8k", "hf://datasets/openai/gsm8k holds several subsets (main, socratic): name one as "
                     "hf://datasets/openai/gsm8k/main"),
    ("hf://datasets/openai/gsm8k/other", "dataset 'openai/gsm8k' has no 'other' in its cached snapshot"),
    ("hf://datasets/openai/gsm8k/../../x", "is not a hub dataset address of the form hf://datasets/ORG/NAME"),
    ("hf://datasets/openai", "is not a hub dataset address"),
    ("other/dataset", "dataset 'other/dataset' is not in the local Hugging Face cache"),
])
def test_a_hub_dataset_that_cannot_be_read_is_one_sentence(gsm8k_cache, capsys, name, fragment):
    line = _one_line_refusal(capsys, ["eval", "--task", name, "--prompt-key", "question"])
    assert fragment in line
    if name == "other/dataset":
        assert "`hf download other/dataset --repo-type dataset`" in line and str(gsm8k_cache) in line


@pytest.mark.parametrize("suffix", [".jsonl", ".json", ".parquet", ".csv"])
def test_every_file_format_gives_the_same_task_set(tmp_path, suffix):
    rows = [{"problem": r["question"], "solution": r["answer"]} for r in GSM8K_ROWS[:5]]
    path = tmp_path / f"math{suffix}"
    if suffix == ".jsonl":
        path.write_bytes(_jsonl(rows))
    elif suffix == ".json":
        path.write_text(json.dumps(rows))
    elif suffix == ".parquet":
        path.write_bytes(_parquet(rows))
    else:
        with path.open("w", newline="") as handle:
            writer = csv.DictWriter(handle, fieldnames=["problem", "solution"])
            writer.writeheader()
            writer.writerows(rows)
    tasks = load_tasks(str(path), prompt_key="problem", answer_key="solution")
    assert [(e.index, e.prompt, e.answer) for e in tasks] == \
        [(i, r["question"], r["answer"].rsplit("#### ", 1)[1].replace(",", "")) for i, r in enumerate(GSM8K_ROWS[:5])]


def test_a_json_file_that_is_not_rows_is_one_sentence(tmp_path):
    path = tmp_path / "bad.json"
    path.write_text('{"rows": 3} [1]')
    with pytest.raises(TaskError, match="bad.json line 1 is not valid JSON"):
        load_tasks(str(path))
    path.write_text("[1, 2]")
    with pytest.raises(TaskError, match="must hold a JSON array of objects"):
        load_tasks(str(path))


def test_a_swarm_runs_task_snapshot_holds_the_standard_columns_so_peers_need_no_mapping(gsm8k_cache, tmp_path):
    """The trainer role writes a hub dataset (or a mapped file) as prompt/answer JSONL: what travels with every
    version loads on a peer with no cache and no keys, to the same entries the trainer reads."""
    source = "hf://datasets/openai/gsm8k/main"
    snapshot = snapshot_task_file(source, tmp_path / "run", 1 << 20, "question", "answer")
    assert snapshot.name == "gsm8k.jsonl" and len(snapshot.root) == 64
    expected = [(e.index, e.prompt, e.answer, e.reward_fn) for e in load_tasks(source, prompt_key="question")]
    peer_copy = tmp_path / "peer" / snapshot.name
    peer_copy.parent.mkdir()
    peer_copy.write_bytes(snapshot.path.read_bytes())
    assert [(e.index, e.prompt, e.answer, e.reward_fn) for e in load_tasks(str(peer_copy))] == expected
    plain = tmp_path / "plain.jsonl"
    plain.write_bytes(_jsonl([{"prompt": "1+1?", "answer": "2"}] * 3))
    copied = snapshot_task_file(str(plain), tmp_path / "run2", 1 << 20)
    assert copied.path.read_bytes() == plain.read_bytes()  # a standard file travels byte for byte
    assert snapshot_task_file("gcd", tmp_path / "run3", 1 << 20) is None


def test_sim_checks_a_mapped_task_file_before_any_peer_starts_and_hands_its_trainer_the_mapping(tmp_path, capsys):
    from swarm.sim.run import SimSettings, _trainer_toml
    from trainer.config import load_config

    data = tmp_path / "gsm8k.jsonl"
    data.write_bytes(_jsonl(GSM8K_ROWS))
    line = _one_line_refusal(capsys, ["sim", "--task", str(data), "--out", str(tmp_path / "sim")])
    assert "row 0 has no 'prompt' column (its columns: question, answer)" in line
    assert not (tmp_path / "sim").exists()
    toml = _trainer_toml(SimSettings(out=tmp_path / "sim2", task=str(data), prompt_key="question"))
    config = load_config(toml).config
    assert (config.task, config.prompt_key, config.answer_key) == (str(data), "question", "answer")


@pytest.mark.parametrize("task", ["openai/gsm8k", "hf://datasets/openai/gsm8k/main", "/etc/tasks.jsonl",
                                  "tasks.csv", "a/b/c"])
def test_a_manifest_naming_a_task_set_each_peer_would_read_from_its_own_disk_is_refused(task):
    """Without a task file travelling with the policy, a run spec may name only a built-in task: a hub dataset or
    a path would be read from each peer's own cache or disk, whose copies differ, so honest work would look
    dishonest."""
    from swarm.errors import UserError
    from swarm.policy.runspec import RunSpec

    raw = RunSpec(task, 64, "{}", 0, 0.2, "all", 2, 1, 1, 1, ("ab" * 32,)).to_dict()
    with pytest.raises(UserError, match="neither built in nor sent with it"):
        RunSpec.from_model({"run_spec": raw})
    assert RunSpec.from_model({"run_spec": {**raw, "task": "gcd"}}).task == "gcd"
