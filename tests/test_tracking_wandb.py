"""W&B through its real code path against a fake `wandb` module (no server can be reached from a test): the
project, name, tags and mode the config names, the config itself, and one run id resumed across restarts."""

from __future__ import annotations

import sys
from types import SimpleNamespace

import pytest

from trainer.config import load_config
from trainer.errors import TrainerError
from trainer.step_record import StepRecord
from trainer.tracking import RUN_ID_FILE, open_tracker


class FakeWandb:
    """What WandbSink calls of wandb: Settings, init, and the run's log and finish."""

    def __init__(self) -> None:
        self.inits: list[dict] = []
        self.logged: list[tuple[dict, int]] = []
        self.finished = 0

    def Settings(self, **settings):  # noqa: N802 - wandb's own name
        return settings

    def init(self, **arguments):
        self.inits.append(arguments)
        return SimpleNamespace(log=lambda scalars, step: self.logged.append((scalars, step)),
                               finish=lambda: setattr(self, "finished", self.finished + 1))


@pytest.fixture
def wandb(monkeypatch):
    fake = FakeWandb()
    monkeypatch.setitem(sys.modules, "wandb", fake)
    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.delenv("WANDB_PROJECT", raising=False)
    return fake


def config(tmp_path, **fields):
    return load_config(overrides={"report_to": "wandb", "out": tmp_path / "run", "run": "demo", **fields}).config


def test_an_online_run_gets_the_configs_project_name_tags_and_the_config_itself(tmp_path, wandb):
    cfg = config(tmp_path, wandb_mode="online", wandb_project="swarm-runs", wandb_name="gcd-tiny",
                 wandb_tags=["gcd", "tiny"])
    tracker = open_tracker(cfg)
    tracker.step(StepRecord(step=0, reward=0.5, groups=1, groups_trained=1, tokens=4, loss=0.1, entropy=1.0, kl=0.0,
                            clip_fraction=0.0, grad_norm=1.0, lr=1e-3, skipped="", old_logprobs="exact", seconds=1.0))
    tracker.close()
    [init] = wandb.inits
    assert (init["mode"], init["project"], init["name"], init["tags"]) == ("online", "swarm-runs", "gcd-tiny",
                                                                           ["gcd", "tiny"])
    assert init["resume"] == "allow" and init["dir"] == str(tmp_path / "run")
    assert init["config"]["run"] == "demo" and init["config"]["out"] == str(tmp_path / "run")
    assert wandb.logged[0][1] == 1 and wandb.logged[0][0]["train/reward"] == 0.5 and wandb.finished == 1


def test_a_restarted_trainer_resumes_the_same_run_and_another_output_directory_starts_its_own(tmp_path, wandb):
    open_tracker(config(tmp_path)).close()
    open_tracker(config(tmp_path)).close()
    open_tracker(config(tmp_path / "other")).close()
    first, again, other = (init["id"] for init in wandb.inits)
    assert first == again != other
    assert (tmp_path / "run" / "wandb" / RUN_ID_FILE).read_text().strip() == first


def test_without_a_configured_mode_w_and_b_stays_offline_and_takes_the_run_name(tmp_path, wandb):
    open_tracker(config(tmp_path)).close()
    [init] = wandb.inits
    assert (init["mode"], init["project"], init["name"], init["tags"]) == ("offline", "rl-swarm", "demo", [])


def test_an_unknown_wandb_mode_is_one_sentence(tmp_path):
    with pytest.raises(TrainerError, match="wandb_mode must be online, offline or empty, got 'cloud'"):
        config(tmp_path, wandb_mode="cloud")
