"""Commands that answer plainly: `swarm keygen --json`, a misspelt TOML section, an unknown --model, and `swarm
eval` saying whose task settings it scores on."""

from __future__ import annotations

import json

import pytest

from inference.errors import InferenceError
from inference.models import check_model_spec
from swarm.cli.eval import _policy_run_settings
from swarm.cli.main import main
from swarm.policy.runspec import RunSpec

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_keygen_json_prints_the_public_key_and_peer_id_as_one_object(tmp_path, capsys):
    path = tmp_path / "trainer.key"
    assert main(["keygen", str(path), "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert set(shown) == {"public_key", "peer_id", "path"} and len(shown["public_key"]) == 64
    assert shown["path"] == str(path) and path.stat().st_size == 32


def test_a_misspelt_section_of_a_peer_toml_gets_the_nearest_section(tmp_path, capsys):
    path = tmp_path / "peer.toml"
    path.write_text('[peerr]\nrun = "demo"\n')
    assert main(["config", "show", "--role", "peer", "--config", str(path)]) == 2
    assert capsys.readouterr().err.strip().endswith("; did you mean [peer]?")


def test_an_unknown_bare_model_name_lists_what_this_machine_holds_instead_of_a_download(tmp_path, monkeypatch):
    (tmp_path / "models--Qwen--Qwen2.5-0.5B").mkdir()
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    with pytest.raises(InferenceError) as caught:
        check_model_spec("nosuch")
    assert str(caught.value) == (
        "model 'nosuch' is neither built in (tiny, tiny-sum, smollm2), in the local Hugging Face cache "
        "(Qwen/Qwen2.5-0.5B) nor a directory: name a model directory by its path (e.g. ./models/mine) or a cached hub "
        "model as ORG/NAME")
    with pytest.raises(InferenceError, match="hf download org/nosuch"):  # a hub id keeps its fetch hint
        check_model_spec("org/nosuch")


def test_eval_without_config_says_it_scores_on_the_default_task_settings(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("SWARM_MODEL_CACHE", str(tmp_path / "cache"))
    assert main(["eval", "--n", "2", "--batch", "2", "--max-new-tokens", "1"]) == 0
    err = capsys.readouterr().err
    assert ("default task settings, not necessarily the run's: task gcd, seed 0, task_size 512, eval_fraction 0.2; "
            "give --config with the run's trainer TOML") in err
    assert main(["eval", "--n", "2", "--batch", "2", "--max-new-tokens", "1", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["task_settings"] == "defaults"


def test_a_swarm_policy_directory_gives_eval_its_runs_task_settings(tmp_path):
    spec = RunSpec("basic_arithmetic", 96, '{"max_terms": 2}', 7, 0.25, "all", 2, 1, 1, 1, ())
    (tmp_path / "model.json").write_text(json.dumps({"run_spec": spec.to_dict()}))
    assert _policy_run_settings(str(tmp_path)) == {"task": "basic_arithmetic", "task_size": 96,
                                                   "task_config": {"max_terms": 2}, "seed": 7, "eval_fraction": 0.25}
    assert _policy_run_settings("tiny") == {} and _policy_run_settings(None) == {}


def test_eval_refuses_a_policy_whose_runs_reward_this_machine_lacks(tmp_path):
    from swarm.errors import UserError

    spec = RunSpec("gcd", 64, "{}", 0, 0.2, "all", 2, 1, 1, 1, (), reward=f"{tmp_path}/gone.py:score",
                   reward_hash="ab" * 32)
    (tmp_path / "model.json").write_text(json.dumps({"run_spec": spec.to_dict()}))
    with pytest.raises(UserError, match=f"the policy's run scores with its own reward: reward file {tmp_path}/gone.py"):
        _policy_run_settings(str(tmp_path))
