"""A run's task file travels with its policies: snapshot, manifest entry, run spec, and the peers' reading of it."""

from __future__ import annotations

import dataclasses
import json

import pytest

from p2p.pieces.manifest import MIN_PIECE_SIZE, file_entry
from swarm.errors import UserError
from swarm.policy import runspec
from swarm.policy.runspec import RunSpec, spec_tasks, training_tasks, version_tasks
from swarm.policy.task_file import place_task_file, snapshot_task_file
from tests.p2p.test_p2p_manifest import build, make_policy

ROWS = [{"prompt": f"What is {i} + {i % 7}?", "answer": str(i + i % 7)} for i in range(60)]


@pytest.fixture(autouse=True)
def fresh_cache():
    runspec._FILE_TASKS.clear()
    yield
    runspec._FILE_TASKS.clear()


def write_rows(path, rows=ROWS):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def spec_for(task_file) -> RunSpec:
    return RunSpec(task_file.name, 512, "{}", 3, 0.2, "all", 2, 1, 1, 1, ("ab" * 32,), "float32", task_file.root)


def published(tmp_path, task_file, name="v0"):
    """A version directory as the trainer publishes it (weights + the task file) and its manifest."""
    directory = tmp_path / name
    make_policy(directory)
    place_task_file(task_file, directory)
    return directory, build(directory, data_files=(task_file.name,))


def test_a_built_in_task_set_has_no_task_file(tmp_path):
    assert snapshot_task_file("gcd", tmp_path, MIN_PIECE_SIZE) is None


def test_the_snapshot_is_a_copy_named_like_the_original_with_its_manifest_root(tmp_path):
    source = write_rows(tmp_path / "mine" / "arith.jsonl")
    task_file = snapshot_task_file(str(source), tmp_path / "run", MIN_PIECE_SIZE)
    assert task_file.name == "arith.jsonl" and task_file.path.parent == tmp_path / "run"
    assert task_file.path.read_bytes() == source.read_bytes()
    assert task_file.root == file_entry(source, MIN_PIECE_SIZE).root.hex()
    source.write_text("edited after the run started\n")  # the run keeps the bytes it started with
    assert task_file.path.read_bytes() != source.read_bytes()


@pytest.mark.parametrize("name, fragment", [("my data.jsonl", "must be up to 128 letters"),
                                            ("absent.jsonl", "does not exist")])
def test_an_unusable_task_file_is_one_line(tmp_path, name, fragment):
    if name != "absent.jsonl":
        write_rows(tmp_path / name)
    with pytest.raises(UserError, match=fragment) as caught:
        snapshot_task_file(str(tmp_path / name), tmp_path / "run", MIN_PIECE_SIZE)
    assert "\n" not in str(caught.value)


def test_peers_read_exactly_the_trainers_rows_from_the_version_directory(tmp_path):
    source = write_rows(tmp_path / "mine" / "arith.jsonl")
    task_file = snapshot_task_file(str(source), tmp_path / "run", MIN_PIECE_SIZE)
    directory, manifest = published(tmp_path, task_file)
    spec = RunSpec.from_model({"run_spec": spec_for(task_file).to_dict()})
    assert spec.task_root == task_file.root and spec.task == "arith.jsonl"
    tasks = version_tasks(spec, manifest, directory)
    trainer = training_tasks(str(task_file.path), 512, "{}", 3, 0.2)  # what the trainer trains on
    assert tasks.train.name == trainer.name == "arith"  # rollouts name the same dataset on both sides
    assert [(e.prompt, e.answer) for e in tasks.train] == [(e.prompt, e.answer) for e in trainer]
    assert tasks.eligible == sorted(trainer.indices()) and tasks.prompts_per_worker == 2


def test_every_version_carries_the_same_file_which_is_parsed_once(tmp_path):
    task_file = snapshot_task_file(str(write_rows(tmp_path / "arith.jsonl")), tmp_path / "run", MIN_PIECE_SIZE)
    first_dir, first = published(tmp_path, task_file, "v0")
    second_dir, second = published(tmp_path, task_file, "v1")
    assert [f.root for f in first.files if f.name == "arith.jsonl"] == [f.root for f in second.files
                                                                         if f.name == "arith.jsonl"]
    spec = spec_for(task_file)
    train = version_tasks(spec, first, first_dir).train
    (second_dir / "arith.jsonl").unlink()  # not read again: the cache is keyed by the file's root
    assert version_tasks(spec, second, second_dir).train is train


def test_a_version_whose_manifest_lacks_its_task_file_is_refused_in_one_line(tmp_path):
    task_file = snapshot_task_file(str(write_rows(tmp_path / "arith.jsonl")), tmp_path / "run", MIN_PIECE_SIZE)
    directory, _ = published(tmp_path, task_file)
    without = build(directory)  # the weights alone
    with pytest.raises(UserError, match="not among the version's files"):
        version_tasks(spec_for(task_file), without, directory)
    other = dataclasses.replace(spec_for(task_file), task_root="0" * 64)  # a root the manifest does not list
    with pytest.raises(UserError, match="not among the version's files"):
        version_tasks(other, build(directory, data_files=("arith.jsonl",)), directory)


def test_a_task_file_spec_needs_the_version_directory(tmp_path):
    task_file = snapshot_task_file(str(write_rows(tmp_path / "arith.jsonl")), tmp_path / "run", MIN_PIECE_SIZE)
    with pytest.raises(UserError, match="travels with the policy"):
        spec_tasks(spec_for(task_file))


@pytest.mark.parametrize("change", [{"task_root": "xyz"}, {"task_root": "A" * 64}, {"task": "../arith.jsonl"},
                                    {"task": "arith.txt"}])
def test_a_malformed_task_file_reference_is_refused(tmp_path, change):
    task_file = snapshot_task_file(str(write_rows(tmp_path / "arith.jsonl")), tmp_path / "run", MIN_PIECE_SIZE)
    raw = {**spec_for(task_file).to_dict(), **change}
    with pytest.raises(UserError, match="malformed name or root"):
        RunSpec.from_model({"run_spec": raw})


def test_specs_of_older_releases_name_no_task_file():
    raw = RunSpec("gcd", 64, "{}", 0, 0.2, "all", 2, 1, 1, 1, ()).to_dict()
    del raw["task_root"]
    assert RunSpec.from_model({"run_spec": raw}).task_root == ""


def test_an_unreadable_task_file_in_a_version_is_one_user_facing_line(tmp_path):
    task_file = snapshot_task_file(str(write_rows(tmp_path / "arith.jsonl")), tmp_path / "run", MIN_PIECE_SIZE)
    directory, manifest = published(tmp_path, task_file)
    (directory / "arith.jsonl").unlink()
    (directory / "arith.jsonl").write_text("not json\n")  # the roles skip the version on this, never crash
    with pytest.raises(UserError, match="line 1 is not valid JSON"):
        version_tasks(spec_for(task_file), manifest, directory)


@pytest.mark.parametrize("change, fragment", [
    ({"validators": "ab" * 32}, "64-hex-digit keys"),  # a string was split into its characters
    ({"validators": ["not hex"]}, "64-hex-digit keys"),  # a non-hex key ended the validator role that read it
    ({"prompts_per_worker": -1}, "prompts_per_worker -1"),
    ({"replicas": True}, "replicas True"),
    ({"task_size": "64"}, "task_size '64'"),
    ({"eval_fraction": float("nan")}, "eval_fraction nan"),
    ({"async_level": 1 << 40}, "async_level"),
])
def test_a_run_spec_with_values_of_the_wrong_type_or_range_is_one_line(tmp_path, change, fragment):
    raw = {**RunSpec("gcd", 64, "{}", 0, 0.2, "all", 2, 1, 1, 1, ("ab" * 32,)).to_dict(), **change}
    with pytest.raises(UserError, match="the manifest's run_spec") as caught:
        RunSpec.from_model({"run_spec": raw})
    assert fragment in str(caught.value)
