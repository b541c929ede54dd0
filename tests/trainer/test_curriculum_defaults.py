"""Which curriculum runs when none is named: FastCuRL, for the trainer and the simulation alike (`swarm bench
curriculum` measured it reaching a reward target on fewer generated tokens, with a higher held-out accuracy, than one
fixed context at the same budget); "none" keeps one context throughout."""

from pathlib import Path

from swarm.cli.main import main
from swarm.sim.run import SimSettings, _trainer_toml
from trainer.config import TrainerConfig, load_config


def test_the_trainer_defaults_to_fastcurls_four_stages():
    assert TrainerConfig().curriculum == "fastcurl"
    loaded = load_config(overrides={"steps": 8, "max_new_tokens": 8})
    assert [(s.data, s.max_new_tokens) for s in loaded.curriculum.stages] == [
        ("short", 4), ("all", 8), ("long", 12), ("all", 8)]
    fixed = load_config(overrides={"steps": 5, "max_new_tokens": 8, "curriculum": "none"})
    assert [(s.data, s.max_new_tokens) for s in fixed.curriculum.stages] == [("all", 8)]


def test_the_simulations_trainer_follows_fastcurl_unless_told(tmp_path):
    default = load_config(_trainer_toml(SimSettings(out=tmp_path / "a")))
    assert [s.max_new_tokens for s in default.curriculum.stages] == [4, 8, 12, 8]
    fixed = load_config(_trainer_toml(SimSettings(out=tmp_path / "b", curriculum="none")))
    assert fixed.curriculum.name == "none" and fixed.curriculum.stages[0].max_new_tokens == 8


def test_a_simulation_with_an_unknown_curriculum_stops_in_one_line(tmp_path, capsys):
    out = tmp_path / "sim"
    assert main(["sim", "--out", str(out), "--curriculum", "fastcurl9"]) == 2
    err = capsys.readouterr().err
    assert "--curriculum 'fastcurl9' is neither a preset" in err and err.count("\n") == 1
    assert not Path(out).exists()  # nothing started, nothing cleared
