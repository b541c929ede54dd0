"""Bad input to the CLI gets one clear line and exit status 2, never a traceback."""

from __future__ import annotations

import contextlib
import io
import json
import subprocess
import sys
import time

import pytest

from swarm.cli import main

SWARM = [sys.executable, "-m", "swarm"]


def run_swarm(*args: str) -> subprocess.CompletedProcess:
    """`swarm ARGS` run by the CLI's own main() in this process (its imports are paid once for the whole file),
    with what it prints captured; the commands that must be real processes use SWARM with subprocess."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        status = main(list(args))
    return subprocess.CompletedProcess(["swarm", *args], status, out.getvalue(), err.getvalue())


@pytest.mark.parametrize(
    "args, fragment",
    [
        (["peer", "start", "--role", "bogus"], "unknown role bogus"),
        (["peer", "start", "--bootstrap", "/ip4/not-an-ip"], "is not a valid multiaddr"),
        (["publish", "/nonexistent/ckpt", "--run", "r", "--key", "/nonexistent/key"], "does not exist"),
        (["peer", "start", "--quorum", "3", "--replicas", "2"], "quorum 3 must be between 1 and replicas"),
        (["peer", "start", "--gpu-memory", "1.5"], "gpu_memory 1.5 is outside 0.05..0.95"),
        (["peer", "start", "--run", "a/b"], "run name 'a/b' must be 1 to 64 letters"),
        (["peer", "start", "--validator-key", "nokey"], "--validator-key 'nokey' is neither a 64-hex-digit public key"),
        (
            ["peer", "start", "--validator-key", "12D3KooWbroken"],
            "--validator-key '12D3KooWbroken' is not a valid peer",
        ),
        (
            ["peer", "start", "--validator-key", "ab" * 32],
            "--validator-key lists 1 distinct key(s) but the quorum needs 2 validators",
        ),
        (["peer", "start", "--role", "inference", "--model", "/nonexistent/model"], "is neither built in (tiny,"),
        (
            ["peer", "start", "--role", "trainer", "--trainer-config", "/nonexistent.toml"],
            "/nonexistent.toml does not exist",
        ),
        (["sim", "--task", "nosuchtask"], "unknown task 'nosuchtask': not a reasoning-gym dataset"),
        (["sim", "--task", "/nonexistent/tasks.jsonl"], "task file /nonexistent/tasks.jsonl does not exist"),
        (["eval", "--n", "-5"], "--n must be at least 1, got -5"),
        (["eval", "--temperature", "-1"], "--temperature must be within 0..10"),
        (["bench", "generate", "--repeats", "0"], "--repeats must be at least 1, got 0"),
        (["bench", "churn", "--kill-every", "-1"], "--kill-every must be 0 (no kills) up to --seconds"),
        (["bench", "churn", "--kill-trainer-every", "-2"], "--kill-trainer-every must be 0 (never) or more; got -2"),
        (["bench", "churn", "--validators", "2", "--quorum", "3"], "need 1 <= --quorum (3) <= --replicas (2)"),
        (["bench", "churn", "--departures", "-1"], "--departures must be 0 or more; got -1"),
        (["status", "--run", "r", "--seconds", "0"], "--seconds must be above 0 and at most 600"),
        (
            [
                "status",
                "--run",
                "r",
                "--bootstrap",
                "/ip4/127.0.0.1/tcp/1/p2p/12D3KooWBHH8EeSjESdYHEVTPRStjT5dF3xWQxZXTGXL7dfsge33",
                "--seconds",
                "1",
            ],
            "no bootstrap peer answered",
        ),
    ],
)
def test_bad_input_is_one_line(tmp_path, args, fragment):
    result = run_swarm(*args, "--data-dir", str(tmp_path / "d")) if args[0] == "peer" else run_swarm(*args)
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    lines = [line for line in result.stderr.splitlines() if line.startswith("swarm: error:")]
    assert len(lines) == 1 and fragment in lines[0]
    assert not (tmp_path / "d").exists()  # a refused peer writes no data directory and no identity key
    if args[0] == "status":
        assert result.stderr.strip() == lines[0]  # nothing else: the observer's host stays quiet


@pytest.mark.parametrize("broken, fragment", [
    ("no model.json", "has no model.json describing the model"),
    ("model.json not JSON", "model.json is not valid JSON"),
    ("no weights", "holds no .safetensors files"),
    ("weights not safetensors", "model.safetensors is not a safetensors file"),
    ("header not tensors", "model.safetensors has a safetensors header that does not describe its tensors"),
])
def test_a_checkpoint_that_cannot_be_published_is_one_line_before_any_peer_starts(tmp_path, broken, fragment):
    """No peer starts, the error is printed once (not as a log line and an event), and an undecodable model.json is
    named in a sentence, not as a bare JSONDecodeError."""
    checkpoint = tmp_path / "ckpt"
    checkpoint.mkdir()
    if broken != "no model.json":
        (checkpoint / "model.json").write_text('{"arch": ' if broken == "model.json not JSON" else '{"arch": "x"}')
    if broken != "no weights":
        header = b"[1, 2]" if broken == "header not tensors" else b"{}"
        weights = b"junk" if broken == "weights not safetensors" else len(header).to_bytes(8, "little") + header
        (checkpoint / "model.safetensors").write_bytes(weights)
    assert run_swarm("keygen", str(tmp_path / "key")).returncode == 0
    result = run_swarm("publish", str(checkpoint), "--run", "r", "--key", str(tmp_path / "key"),
                       "--data-dir", str(tmp_path / "d"))
    assert result.returncode == 2 and "Traceback" not in result.stderr
    line = result.stderr.strip()
    assert "\n" not in line and line.startswith(f"swarm: error: cannot publish {checkpoint}: ") and fragment in line
    assert result.stdout == "" and not (tmp_path / "d").exists()  # no peer was started


@pytest.mark.parametrize("config, weights, fragment", [
    ('{"eos_token_id": 1}', b"junk", "model.safetensors is not a safetensors file"),
    ('{"eos_token_id": ', None, "config.json is not a readable JSON file"),
    ("{}", None, "names no end-of-sequence token"),
])
def test_a_hugging_face_directory_that_cannot_be_published_is_one_line(tmp_path, config, weights, fragment):
    checkpoint = tmp_path / "hf"
    checkpoint.mkdir()
    (checkpoint / "config.json").write_text(config)
    if weights is not None:
        (checkpoint / "model.safetensors").write_bytes(weights)
    assert run_swarm("keygen", str(tmp_path / "key")).returncode == 0
    result = run_swarm("publish", str(checkpoint), "--run", "r", "--key", str(tmp_path / "key"),
                       "--data-dir", str(tmp_path / "d"))
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert (
        result.stderr.strip().startswith(f"swarm: error: cannot publish {checkpoint}: ") and fragment in result.stderr
    )
    assert not (tmp_path / "d").exists() and sorted(p.name for p in checkpoint.iterdir()) == sorted(
        ["config.json"] + (["model.safetensors"] if weights else [])
    )


def test_second_process_on_the_same_data_dir_is_refused(tmp_path):
    first = subprocess.Popen([*SWARM, "peer", "start", "--data-dir", str(tmp_path / "d"), "--json-events"],
                             stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, cwd=tmp_path)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            line = first.stdout.readline()
            if not line or json.loads(line)["event"] == "listening":
                break
        second = run_swarm("peer", "start", "--data-dir", str(tmp_path / "d"))
    finally:
        first.terminate()
        first.wait(20)
    assert second.returncode == 2 and "Traceback" not in second.stderr
    assert "in use by another swarm process" in second.stderr


def test_unreachable_bootstrap_peer_is_one_warning_and_the_peer_runs(tmp_path):
    dead = "/ip4/127.0.0.1/tcp/9/p2p/12D3KooWKgvMnRQjUKcxwkLiauTUqk8fXhs8WTs4UwnPcvr97u47"
    proc = subprocess.Popen([*SWARM, "peer", "start", "--data-dir", str(tmp_path / "d"), "--bootstrap", dead,
                             "--json-events"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    events = []
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not any(e["event"] == "listening" for e in events):
            line = proc.stdout.readline()
            if not line:
                break
            events.append(json.loads(line))
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=20)
    kinds = [e["event"] for e in events]
    assert "bootstrap_unreachable" in kinds and "listening" in kinds
    assert "Traceback" not in err and "unreachable" not in err  # the event is the one report, not a log line too


def test_a_bad_backend_in_a_config_file_is_one_line(tmp_path):
    config = tmp_path / "peer.toml"
    config.write_text('[peer]\nroles = ["inference"]\nbackend = "tpu"\n')
    result = run_swarm("peer", "start", "--config", str(config), "--data-dir", str(tmp_path / "d"))
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "swarm: error: unknown backend 'tpu': choose from torch, vllm" in result.stderr


@pytest.mark.parametrize("line, fragment", [
    ("heartbeat_every_s = 0", "heartbeat_every_s must be positive"),
    ("heartbeat_every_s = 20", "peer_silence_s 30 must be at least 3 heartbeats (60 s)"),
])
def test_heartbeats_too_rare_to_judge_liveness_are_one_line(tmp_path, line, fragment):
    config = tmp_path / "peer.toml"
    config.write_text(f"[peer]\n{line}\n")
    result = run_swarm("peer", "start", "--config", str(config), "--data-dir", str(tmp_path / "d"))
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert f"swarm: error: {fragment}" in result.stderr


def test_a_data_or_output_directory_that_is_a_file_is_one_line(tmp_path):
    afile = tmp_path / "afile"
    afile.write_text("keep me")
    for args, fragment in [(["peer", "start", "--data-dir", str(afile)], f"data directory {afile} exists and is not"),
                           (["sim", "--out", str(afile)], f"--out {afile} exists and is not a directory"),
                           (["train", "--out", str(afile), "--steps", "1"], f"output directory {afile} exists")]:
        result = run_swarm(*args)
        assert result.returncode == 2 and "Traceback" not in result.stderr, args
        assert result.stderr.strip().startswith("swarm: error:") and fragment in result.stderr, result.stderr
    assert afile.read_text() == "keep me"


@pytest.mark.parametrize("flags, fragment", [
    (["--task", "nosuchtask"], "unknown task 'nosuchtask'"),
    (["--model", "/nonexistent/model"], "is neither built in (tiny,"),
])
def test_a_refused_train_creates_no_output_directory(tmp_path, flags, fragment):
    """The refusal comes once --out exists (the task and the model load inside the session); what the command
    created is taken back, and a directory that was there before keeps its files."""
    fresh = tmp_path / "runs" / "one"
    result = run_swarm("train", "--out", str(fresh), "--steps", "1", *flags)
    assert result.returncode == 2 and "Traceback" not in result.stderr and fragment in result.stderr
    assert not (tmp_path / "runs").exists()
    kept = tmp_path / "kept"
    kept.mkdir()
    (kept / "notes.txt").write_text("mine")
    assert run_swarm("train", "--out", str(kept), "--steps", "1", *flags).returncode == 2
    assert [p.name for p in kept.iterdir()] == ["notes.txt"]


def test_sim_clears_only_a_directory_an_earlier_simulation_wrote(tmp_path):
    """`swarm sim` starts fresh by deleting --out: pointed at a directory of other files it must refuse, not wipe."""
    from swarm.cli.sim import SIM_MARKER, _clear_previous_run
    from swarm.errors import UserError

    project = tmp_path / "project"
    project.mkdir()
    (project / "notes.txt").write_text("precious")
    result = run_swarm("sim", "--out", str(project))
    assert result.returncode == 2 and "holds files that are not a simulation's" in result.stderr
    assert (project / "notes.txt").read_text() == "precious"
    earlier = tmp_path / "sim"
    _clear_previous_run(earlier)  # a new directory: created and marked
    (earlier / "trainer").mkdir()
    _clear_previous_run(earlier)  # an earlier simulation's: cleared and marked again
    assert sorted(p.name for p in earlier.iterdir()) == [SIM_MARKER]
    (earlier / SIM_MARKER).unlink()
    (earlier / "report.json").write_text("{}")  # a run from before the marker existed: its report identifies it
    _clear_previous_run(earlier)
    assert sorted(p.name for p in earlier.iterdir()) == [SIM_MARKER]
    with pytest.raises(UserError, match="not a simulation's"):
        _clear_previous_run(project)


def test_an_exception_group_of_user_facing_errors_is_one_line_and_a_bug_in_one_is_not_hidden():
    from swarm.cli.main import user_facing_error
    from swarm.errors import UserError

    first, second = UserError("cannot listen on X"), UserError("other")
    assert user_facing_error(first) is first
    assert user_facing_error(ExceptionGroup("peer", [ExceptionGroup("host", [first]), second])) is first
    assert user_facing_error(ExceptionGroup("peer", [first, KeyError("bug")])) is None
    assert user_facing_error(ValueError("bug")) is None


@pytest.mark.parametrize("toml, message", [
    ('upload_mbps = "fast"', "config key limits.upload_mbps in {} takes a number, got 'fast'"),
    ('reseed = "no"', "config key mirror.reseed in {} takes true or false, got 'no'"),
    ("max_peers = 2.5", "config key limits.max_peers in {} takes a whole number, got 2.5"),
    ("max_peers = true", "config key limits.max_peers in {} takes a whole number, got True"),
    ("bootstrap = [1, 2]", "config key peer.bootstrap in {} takes a string or a list of strings, got [1, 2]"),
    ("data_dir = 3", "config key peer.data_dir in {} takes a path, got 3"),
])
def test_a_config_value_of_the_wrong_type_names_its_key(tmp_path, toml, message):
    """A TOML string where a number belongs failed as "'<' not supported between instances of 'str' and 'int'"."""
    from swarm.config import load_config
    from swarm.errors import UserError

    path = tmp_path / "peer.toml"
    path.write_text(f"[peer]\n{toml}\n")
    with pytest.raises(UserError) as caught:
        load_config(path, {})
    assert str(caught.value) == message.format(f"config file {path}")
    assert load_config(None, {"upload_mbps": 8, "listen": "/ip4/127.0.0.1/tcp/0"}).limits.upload_mbps == 8.0


def test_a_config_files_bootstrap_entry_is_checked_named_by_its_file_and_overridden_by_the_flag(tmp_path):
    """Merged into the peer's settings, a bad entry was reported as `--bootstrap line 2`, a flag never given."""
    from swarm.config import load_config
    from swarm.errors import UserError

    good = "/ip4/10.0.0.1/tcp/1/p2p/12D3KooWKgvMnRQjUKcxwkLiauTUqk8fXhs8WTs4UwnPcvr97u47"
    flag = good.replace("10.0.0.1", "10.0.0.2")
    path = tmp_path / "peer.toml"
    path.write_text(f'[peer]\nbootstrap = ["{good}", "/ip4/10.0.0.1/tcp/1"]\n')
    with pytest.raises(UserError) as caught:
        load_config(path, {})
    assert str(caught.value).startswith(f"config file {path}, bootstrap line 2: '/ip4/10.0.0.1/tcp/1' lacks")
    path.write_text(f'[peer]\nbootstrap = "{good}"\n')
    assert load_config(path, {}).peer.bootstrap == (good,)
    assert load_config(path, {"bootstrap": (flag,)}).peer.bootstrap == (flag,)  # the flag wins over the file
