"""`swarm sim --config FILE`: the trainer TOML that `swarm train --config` reads decides the simulated run too, so
the swarm and the single-machine loop are compared on one configuration; the simulation changes only what a swarm
on one machine must (its asynchronous window, one torch thread, checkpoints) and what its own flags give."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
import trio

from swarm.cli.main import build_parser, main
from swarm.cli.sim import SIM_ASYNC_LEVEL, _settings
from swarm.events import Emitted, EventSink
from swarm.sim.run import SimSettings, _trainer_toml, run_sim, summarize
from trainer.config import load_config

CONFIGS = Path(__file__).resolve().parent.parent / "trainer" / "configs"


def _args(*words: str):
    argv = ["sim", *words]
    return build_parser(argv).parse_args(argv)


def test_the_config_decides_model_task_sizes_and_curriculum(tmp_path):
    settings = _settings(_args("--out", str(tmp_path), "--config", str(CONFIGS / "smollm2_addsub.toml"),
                               "--inference", "3", "--time-limit-min", "90"))
    file = load_config(CONFIGS / "smollm2_addsub.toml").config
    assert (settings.model, settings.task, settings.steps, settings.eval_every) == (
        file.model, file.task, file.steps, file.eval_every) == ("smollm2", "basic_arithmetic", 200, 20)
    assert settings.prompts_per_worker == 3  # 8 prompts a step over 3 honest workers: 3 each, 9 >= 8
    assert settings.timeout_s == 900.0 + 90 * 60.0  # the final evaluation and shutdown fit after the limit
    simulated = load_config(_trainer_toml(settings)).config
    assert simulated.async_level == SIM_ASYNC_LEVEL and simulated.threads == 1 and simulated.time_limit_min == 90
    same = ("lr", "temperature", "eps_high", "group_size", "prompts_per_step", "max_new_tokens", "task_config",
            "eval_n", "curriculum", "seed")
    assert {k: getattr(simulated, k) for k in same} == {k: getattr(file, k) for k in same}
    assert simulated.checkpoint_every >= simulated.steps  # a simulation starts fresh: only the last is kept


def test_steps_and_evaluation_flags_override_the_config(tmp_path):
    settings = _settings(_args("--out", str(tmp_path), "--config", str(CONFIGS / "tiny_gcd.toml"), "--steps", "5",
                               "--eval-every", "2"))
    simulated = load_config(_trainer_toml(settings)).config
    assert (simulated.steps, simulated.eval_every, simulated.lr) == (5, 2, 3e-3)


def test_a_task_file_relative_to_the_working_directory_reaches_the_trainer_by_its_full_path(tmp_path, monkeypatch):
    tasks = tmp_path / "qa.jsonl"
    tasks.write_text("".join(f'{{"prompt": "say {i}", "answer": "{i}"}}\n' for i in range(20)))
    config = tmp_path / "run.toml"
    config.write_text('model = "tiny"\ntask = "qa.jsonl"\ncurriculum = "none"\nsteps = 3\n')
    monkeypatch.chdir(tmp_path)
    settings = _settings(_args("--out", str(tmp_path / "sim"), "--config", str(config)))
    monkeypatch.chdir("/")
    assert load_config(_trainer_toml(settings)).config.task == str(tasks)  # the trainer peer finds it


@pytest.mark.parametrize("flag, value", [("--model", "tiny"), ("--task", "gcd"), ("--curriculum", "none")])
def test_a_flag_the_config_decides_is_refused_in_one_line(tmp_path, capsys, flag, value):
    out = tmp_path / "sim"
    assert main(["sim", "--out", str(out), "--config", str(CONFIGS / "tiny_gcd.toml"), flag, value]) == 2
    err = capsys.readouterr().err
    assert f"{flag} and --config both set" in err and err.count("\n") == 1
    assert not out.exists()  # nothing started, nothing cleared


def test_a_config_that_does_not_load_is_one_line(tmp_path, capsys):
    bad = tmp_path / "bad.toml"
    bad.write_text('lr = "fast"\n')
    assert main(["sim", "--out", str(tmp_path / "sim"), "--config", str(bad)]) == 2
    err = capsys.readouterr().err
    assert "lr" in err and err.count("\n") == 1


@pytest.mark.timeout(200)
def test_the_swarm_trainer_stops_stepping_at_its_time_limit(tmp_path):
    """A limit far shorter than 40 steps: the trainer stops early, and still scores and saves its final policy."""
    settings = SimSettings(out=tmp_path, inference=1, validators=1, seeds=0, steps=40, time_limit_min=0.002,
                           group_size=4, prompts_per_worker=2, timeout_s=150.0)
    events: list[Emitted] = []
    sink = EventSink(json_lines=True, stream=io.StringIO())
    sink.listeners.append(events.append)
    report = summarize(events, trio.run(run_sim, settings, sink))
    assert not report["timed_out"] and report["steps"] < 40
    assert "after" in report["heldout_accuracy"] and report["final_policy"]
