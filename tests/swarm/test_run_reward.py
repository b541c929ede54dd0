"""A run's own reward through the swarm: the run spec that names it by its code hash, the tasks it scores, the
trainer config field, and the validator that refuses to vote without the same bytes."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import pytest

from swarm.errors import UserError
from swarm.policy.runspec import RunSpec, training_tasks
from swarm.roles.validator import VersionModels
from trainer.config import apply_reward, load_config
from trainer.errors import TrainerError
from verify.reward_loading import code_hash

REWARD = "def score(completions, answer, **_):\n    return [0.3 + 0.3 * (len(c) % 2) for c in completions]\n"


def reward_name(tmp_path, source: str = REWARD, file: str = "run_reward.py") -> str:
    path = tmp_path / file
    path.write_text(source)
    return f"{path}:score"


def spec_with(reward: str = "", reward_hash: str = "") -> RunSpec:
    return RunSpec("gcd", 64, "{}", 0, 0.2, "all", 2, 1, 1, 1, ("ab" * 32,), reward=reward, reward_hash=reward_hash)


def test_the_run_spec_carries_the_reward_and_its_hash_and_older_specs_name_none(tmp_path):
    name = reward_name(tmp_path)
    spec = spec_with(name, code_hash(name))
    assert RunSpec.from_model({"run_spec": spec.to_dict()}) == spec and spec.reward_problem() == ""
    raw = spec_with().to_dict()
    del raw["reward"], raw["reward_hash"]
    assert RunSpec.from_model({"run_spec": raw}).reward == ""


@pytest.mark.parametrize("reward, reward_hash, fragment", [
    ("not a name", "ab" * 32, "reward by a malformed name"),
    ("pkg.mod:fn", "xyz", "without a 64-hex-digit BLAKE3 hash"),
    ("", "ab" * 32, "reward by a malformed name"),
])
def test_a_malformed_reward_in_a_run_spec_is_one_line(reward, reward_hash, fragment):
    with pytest.raises(UserError, match=fragment):
        RunSpec.from_model({"run_spec": spec_with(reward, reward_hash).to_dict()})


def test_training_tasks_of_a_spec_with_a_reward_are_scored_by_it(tmp_path):
    name = reward_name(tmp_path)
    train = training_tasks("gcd", 64, "{}", 0, 0.2, name)
    assert {entry.reward_fn for entry in train} == {name}
    assert {entry.reward_fn for entry in training_tasks("gcd", 64, "{}", 0, 0.2)} == {"rg:gcd"}


def events_context():
    emitted: list = []
    events = SimpleNamespace(emit=emitted.append)
    return SimpleNamespace(events=events, peer=SimpleNamespace(run="demo")), emitted


def test_a_validator_whose_reward_bytes_differ_refuses_the_run_once_saying_which_hashes(tmp_path):
    name = reward_name(tmp_path)
    expected = "cd" * 32
    node, emitted = events_context()
    models = VersionModels(loaded=None)
    spec = spec_with(name, expected)
    assert models.refuses_reward(node, spec) and models.refuses_reward(node, spec)
    assert len(emitted) == 1 and emitted[0].kind == "reward_refused"
    assert emitted[0].message == (f"refusing to vote on run demo: reward {name} should hash {expected[:16]}... but "
                                     f"this peer's copy hashes {code_hash(name)[:16]}...")
    assert not models.refuses_reward(node, dataclasses.replace(spec, reward_hash=code_hash(name)))


def test_a_validator_without_the_reward_file_refuses_the_run(tmp_path):
    node, emitted = events_context()
    assert VersionModels(loaded=None).refuses_reward(node, spec_with(f"{tmp_path}/gone.py:score", "ab" * 32))
    assert emitted[0].message == f"refusing to vote on run demo: reward file {tmp_path}/gone.py does not exist"


def test_the_trainer_config_names_a_reward_and_refuses_one_that_does_not_load(tmp_path):
    name = reward_name(tmp_path)
    assert load_config(overrides={"reward": name}).config.reward == name
    with pytest.raises(TrainerError, match="reward module 'nosuch_xyz' is not installed"):
        load_config(overrides={"reward": "nosuch_xyz:score"})


def test_a_reward_that_answers_in_the_wrong_shape_stops_the_trainer_at_its_start(tmp_path):
    name = reward_name(tmp_path, "def score(completions, **_):\n    return 1.0\n", "scalar.py")
    cfg = load_config(overrides={"reward": name}).config
    with pytest.raises(TrainerError, match=f"reward {name} returned a float, not a list of floats"):
        apply_reward(cfg, training_tasks("gcd", 64, "{}", 0, 0.2))
