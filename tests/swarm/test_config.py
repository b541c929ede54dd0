"""Typed configs through the real command line: --set, its errors, `swarm config show` round trips, old files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from inference.models import BUILT_IN_MODELS
from swarm.cli.main import main
from swarm.config import PeerConfig
from swarm.config import load_config as load_peer_config
from swarm.errors import UserError
from trainer.config import TrainerConfig
from trainer.config import load_config as load_trainer_config


def swarm(capsys, *argv: str) -> tuple[int, str, str]:
    status = main(list(argv))
    out, err = capsys.readouterr()
    return status, out, err


def error_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("swarm: error: "), err
    return lines[0].removeprefix("swarm: error: ")


def test_set_reaches_any_field_of_either_config(capsys):
    status, out, _ = swarm(capsys, "config", "show", "--json", "--set", "trainer.lr=2e-5", "--set",
                           "trainer.task_config={max_value = 50}", "--set", "trainer.generator_own_session=true")
    trainer = json.loads(out)["trainer"]
    assert status == 0 and trainer["lr"] == 2e-5 and trainer["task_config"] == {"max_value": 50}
    assert trainer["generator_own_session"] is True
    status, out, _ = swarm(capsys, "config", "show", "--role", "peer", "--json", "--set", "peer.run=demo",
                           "--set", 'peer.listen=["/ip4/0.0.0.0/tcp/4001"]', "--set", "trainer.quorum_timeout_s=60",
                           "--set", "limits.max_peers=8")
    peer = json.loads(out)
    assert status == 0 and peer["peer"]["run"] == "demo" and peer["peer"]["listen"] == ["/ip4/0.0.0.0/tcp/4001"]
    assert peer["trainer"]["quorum_timeout_s"] == 60.0 and peer["limits"]["max_peers"] == 8


@pytest.mark.parametrize("argv, sentence", [
    (["--set", "trainer.lrr=1e-5"], "unknown config key 'trainer.lrr' in --set trainer.lrr=1e-5; "
                                    "did you mean 'trainer.lr'?"),
    (["--set", "lr=1e-5"], "unknown config key 'lr' in --set lr=1e-5; did you mean 'trainer.lr'?"),
    (["--set", "trainer.steps=ten"], "config key trainer.steps in --set trainer.steps=ten takes a whole number, "
                                     "got 'ten'"),
    (["--set", "trainer.steps=2.5"], "config key trainer.steps in --set trainer.steps=2.5 takes a whole number, "
                                     "got 2.5"),
    (["--set", "trainer.filter_zero_advantage=1"], "config key trainer.filter_zero_advantage in "
                                                   "--set trainer.filter_zero_advantage=1 takes true or false, got 1"),
    (["--set", "trainer.steps"], "--set takes SECTION.FIELD=VALUE, got 'trainer.steps'"),
    (["--set", "trainer.lr=nan"], "config key trainer.lr in --set trainer.lr=nan takes a finite number, got nan"),
    (["--role", "peer", "--set", "trainer.lr=1e-4"], "trainer.lr is a setting of the trainer's own config, not of "
                                                     "the peer: put it in the TOML file that --trainer-config names "
                                                     "(`swarm config show --role trainer` prints one)"),
    (["--set", "trainer.steps=0"], "steps must be at least 1, got 0"),
    (["--role", "peer", "--set", "trainer.quorm=1"], "unknown config key 'trainer.quorm' in --set trainer.quorm=1; "
                                                     "did you mean 'trainer.quorum'?"),
    (["--role", "peer", "--set", "quorum=1"], "unknown config key 'quorum' in --set quorum=1; "
                                              "did you mean 'trainer.quorum'?"),
    (["--role", "peer", "--set", "peer.listen=[1]"], "config key peer.listen in --set peer.listen=[1] takes a string "
                                                     "or a list of strings, got [1]"),
    (["--role", "peer", "--set", "limits.upload_mbps=-1"], "upload_mbps must not be negative"),
])
def test_a_bad_set_is_one_sentence(capsys, argv, sentence):
    status, out, err = swarm(capsys, "config", "show", *argv)
    assert status == 2 and out == "" and error_line(err) == sentence


def test_commands_take_set_and_refuse_a_field_given_twice(capsys, tmp_path):
    """train, eval and peer start read --set before doing anything; a refused peer writes no data directory."""
    status, _, err = swarm(capsys, "train", "--out", str(tmp_path / "out"), "--set", "trainer.group_size=0")
    assert status == 2 and error_line(err) == "group_size must be at least 1, got 0"
    assert not (tmp_path / "out").exists()
    status, _, err = swarm(capsys, "train", "--lr", "1e-4", "--set", "trainer.lr=1e-5")
    assert status == 2 and error_line(err) == "trainer.lr is given twice, by its own flag and by --set: give it once"
    status, _, err = swarm(capsys, "eval", "--set", "trainer.eval_fraction=1.5")
    assert status == 2 and error_line(err) == "eval_fraction must be between 0 and 1, got 1.5"
    data = tmp_path / "peer"
    status, _, err = swarm(capsys, "peer", "start", "--data-dir", str(data), "--set", "peer.run=a/b")
    assert status == 2 and error_line(err).startswith("run name 'a/b' must be 1 to 64 letters")
    status, _, err = swarm(capsys, "peer", "start", "--data-dir", str(data), "--set", "inference.backend=tpu")
    assert status == 2 and error_line(err) == "unknown backend 'tpu': choose from torch, vllm"
    assert not data.exists()


def test_a_config_file_error_names_the_file_and_the_closest_key(capsys, tmp_path):
    path = tmp_path / "peer.toml"
    path.write_text("[trainer]\nquorom = 1\n")
    status, _, err = swarm(capsys, "config", "show", "--role", "peer", "--config", str(path))
    assert status == 2
    assert error_line(err) == (f"unknown config key 'trainer.quorom' in config file {path}; "
                               "did you mean 'trainer.quorum'?")
    path.write_text('[limits]\nmax_peers = "many"\n')
    status, _, err = swarm(capsys, "config", "show", "--role", "peer", "--config", str(path))
    assert error_line(err) == f"config key limits.max_peers in config file {path} takes a whole number, got 'many'"
    path.write_text("colour = 1\n")
    status, _, err = swarm(capsys, "config", "show", "--config", str(path))
    assert error_line(err) == f"unknown config key 'trainer.colour' in config file {path}"


PEER_SETS = ["peer.run=demo", "peer.roles=['trainer', 'seed']", "peer.bootstrap_file=elsewhere.txt",
             "trainer.config=trainer/configs/tiny_gcd.toml", "trainer.validator_keys=[]", "mirror.reseed=false",
             "limits.upload_mbps=12.5", "inference.gpu_memory=0.5", "peer.heartbeat_every_s=1e1"]
TRAINER_SETS = ["trainer.lr=3e-05", "trainer.task_config={max_value = 50, name = 'a \"quoted\" word'}",
                "trainer.out=runs/x y", "trainer.time_limit_min=0.5", "trainer.async_level=2"]


@pytest.mark.parametrize("role, sets, load", [
    ("peer", PEER_SETS, lambda path, sets: load_peer_config(path, {}, sets)),
    ("trainer", TRAINER_SETS, lambda path, sets: load_trainer_config(path, None, sets).config),
])
def test_config_show_prints_a_file_that_loads_back_to_the_same_config(capsys, tmp_path, role, sets, load):
    status, shown, _ = swarm(capsys, "config", "show", "--role", role, *[w for s in sets for w in ("--set", s)])
    assert status == 0
    path = tmp_path / f"{role}.toml"
    path.write_text(shown)
    expected = load(None, sets)
    assert load(path, []) == expected and expected != load(None, [])
    assert swarm(capsys, "config", "show", "--role", role, "--config", str(path))[1].split("\n", 1)[1] == \
        shown.split("\n", 1)[1]  # and prints the same file again (only the header names the source)
    comments = " ".join(line[2:] for line in shown.splitlines() if line.startswith("# "))
    sections = [info.annotation for info in PeerConfig.model_fields.values()] if role == "peer" else [TrainerConfig]
    for section in sections:  # every field's description is printed above it
        assert all(field.description in comments for field in section.model_fields.values())


def test_a_trainer_config_with_its_own_stages_round_trips(capsys, tmp_path):
    source = tmp_path / "staged.toml"
    source.write_text('steps = 5\n[[stage]]\nname = "short"\ndata = "short"\nmax_new_tokens = 4\ngroup_size = 2\n'
                      'steps = 2\n[[stage]]\nname = "long"\ndata = "long"\nmax_new_tokens = 8\ngroup_size = 4\n'
                      'steps = 3\n')
    shown = swarm(capsys, "config", "show", "--config", str(source))[1]
    copy = tmp_path / "copy.toml"
    copy.write_text(shown)
    original, again = load_trainer_config(source), load_trainer_config(copy)
    assert again.config == original.config and again.curriculum.stages == original.curriculum.stages


@pytest.mark.parametrize("path", sorted(Path("trainer/configs").glob("*.toml")), ids=lambda p: p.name)
def test_the_shipped_trainer_configs_load(path):
    loaded = load_trainer_config(path)
    assert loaded.config.model in BUILT_IN_MODELS and loaded.config.curriculum == "none"


OLD_PEER_TOML = """\
[peer]
roles = ["trainer", "seed"]
run = "old"
data_dir = "d"
bootstrap_file = "none.txt"
keep_versions = 4
upload_mbps = 8
max_peers = 16
reseed = false
trainer_config = "trainer/configs/tiny_gcd.toml"
replicas = 3
quorum = 2
quorum_timeout_s = 30
backend = "torch"
gpu_memory = 0.4
heartbeat_every_s = 2
"""


def test_a_flat_peer_file_loads_each_key_into_its_section(tmp_path):
    for text in (OLD_PEER_TOML, OLD_PEER_TOML.replace("[peer]\n", "")):  # a [peer] table or top-level keys
        path = tmp_path / "old.toml"
        path.write_text(text)
        config = load_peer_config(path, {})
        assert config.peer.roles == ("trainer", "seed") and config.peer.run == "old"
        assert config.peer.data_dir == Path("d") and config.peer.heartbeat_every_s == 2.0
        assert (config.mirror.keep_versions, config.mirror.reseed) == (4, False)
        assert (config.limits.upload_mbps, config.limits.max_peers) == (8.0, 16)
        assert config.trainer.config == Path("trainer/configs/tiny_gcd.toml")
        assert (config.trainer.replicas, config.trainer.quorum, config.trainer.quorum_timeout_s) == (3, 2, 30.0)
        assert (config.inference.backend, config.inference.gpu_memory) == ("torch", 0.4)


def test_peer_field_names_are_unique_across_sections_so_flat_files_find_each_key():
    from swarm.config import FLAT_NAMES, SECTIONS

    names = [field for section in SECTIONS.values() for field in section.model_fields]
    # and two old names: trainer_config (trainer.config) and reach (reach.mode)
    assert len(names) == len(set(names)) == len(FLAT_NAMES) - 2


def test_the_inbound_admission_rates_reach_the_host_and_must_be_positive():
    limits = load_peer_config(None, {"new_peers_per_s": 3.0, "inbound_handshakes_per_s": 9.0}).limits.inbound_limits()
    assert (limits.strangers_per_s, limits.handshakes_per_s) == (3.0, 9.0)
    for bad in (0.0, -1.0):  # NaN is refused as no finite number before this check
        with pytest.raises(UserError, match="must be positive"):
            load_peer_config(None, {"new_peers_per_s": bad})
