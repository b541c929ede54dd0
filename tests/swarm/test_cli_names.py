"""The command line speaks one language: --version, group help, defaults in --help, one flag name per idea, one
set of defaults shared by `swarm train`, `swarm sim` and the trainer's config."""

from __future__ import annotations

import subprocess
import sys

import pytest

from swarm.cli.main import build_parser, main
from trainer.config import TrainerConfig


def test_version_prints_the_installed_version():
    from importlib.metadata import version

    result = subprocess.run([sys.executable, "-m", "swarm", "--version"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0 and result.stdout.strip() == f"swarm {version('rl-swarm')}"


@pytest.mark.parametrize("group, inside, outside", [
    ("peer", "start", "publish"),
    ("bench", "broadcast", "publish"),
    ("config", "show", "publish"),
])
def test_a_command_group_alone_prints_its_own_commands(capsys, group, inside, outside):
    assert main([group]) == 2
    out = capsys.readouterr().out
    assert out.startswith(f"usage: swarm {group} ") and inside in out and outside not in out


def help_text(capsys, *words: str) -> str:
    with pytest.raises(SystemExit):
        main([*words, "--help"])
    return " ".join(capsys.readouterr().out.split())  # argparse's wrapping undone


@pytest.mark.parametrize("words, shown", [
    (("train",), ["--lr X Peak AdamW learning rate (default: 0.001)", "--task TASK", '(default: "gcd")',
                  "--async-level N Maximum policy-version lag of a rollout", "--nproc NPROC", "(default: 1)"]),
    (("peer", "start"), ["--quorum N Accepting votes a rollout needs (trainer role) (default: 2)",
                         '(default: "torch")', "--keep-versions N"]),
    (("sim",), ["--inference INFERENCE honest inference peers (default: 2)", "--steps STEPS", "(default: 16)"]),
    (("bench", "transfer"), ["--repeats N runs per path; medians are reported (default: 5)"]),
])
def test_help_shows_each_default(capsys, words, shown):
    text = help_text(capsys, *words)
    for fragment in shown:
        assert fragment in text


@pytest.mark.parametrize("words, old, value, dest, new", [
    (["peer", "start"], ["--json-events"], True, "json", "--json"),
    (["peer", "start"], ["--key", "k"], "k", "identity_key", "--identity-key"),
    (["publish", "ckpt", "--run", "r"], ["--json-events"], True, "json", "--json"),
    (["publish", "ckpt", "--run", "r"], ["--key", "k"], "k", "run_key", "--run-key"),
    (["sim"], ["--seeds", "3"], 3, "seeds", "--seed-peers"),
    (["bench", "churn"], ["--seeds", "3"], 3, "seeds", "--seed-peers"),
    (["bench", "transfer"], ["--repeat", "2"], 2, "repeat", "--repeats"),
])
def test_old_flag_names_still_parse_but_help_shows_only_the_one_name(capsys, words, old, value, dest, new):
    args = build_parser([*words, *old]).parse_args([*words, *old])
    assert str(getattr(args, dest)) == str(value)
    new_args = [new] if value is True else [new, str(value)]
    assert str(getattr(build_parser([*words, *new_args]).parse_args([*words, *new_args]), dest)) == str(value)
    text = help_text(capsys, *words[:2] if words[0] != "publish" else words[:1])
    assert new in text and f"{old[0]} " not in text.replace(new, "")


def test_train_sim_and_the_config_share_task_async_level_and_learning_rate(tmp_path):
    from swarm.cli.sim import SIM_ASYNC_LEVEL, SIM_DEFAULTS
    from swarm.sim.run import SimSettings, _trainer_toml
    from trainer.config import load_config

    defaults = TrainerConfig()
    train = build_parser(["train"]).parse_args(["train"])
    assert (train.task, train.async_level, train.lr) == (None, None, None)  # unset: the config's default holds
    sim = build_parser(["sim"]).parse_args(["sim"])
    assert sim.task is None  # unset: the simulation's default, or its --config file's, holds
    assert defaults.task == SimSettings(out=tmp_path).task  # settings built in code default to the trainer's
    assert sim.async_level == SIM_ASYNC_LEVEL == SimSettings(out=tmp_path).async_level != defaults.async_level
    simulated = load_config(_trainer_toml(SimSettings(out=tmp_path))).config
    assert (simulated.task, simulated.lr) == (defaults.task, defaults.lr)
    # the command's own defaults: tiny-sum on its task at its learning rate (swarm.cli.sim.SIM_LEARNING_RATES)
    assert (SIM_DEFAULTS["model"], SIM_DEFAULTS["task"]) == ("tiny-sum", "chain_sum")
    demo = load_config(_trainer_toml(SimSettings(out=tmp_path, model="tiny-sum", lr=5e-4))).config
    assert (demo.model, demo.lr) == ("tiny-sum", 5e-4)
    assert simulated.async_level == SIM_ASYNC_LEVEL  # the one override, named in --async-level's help
