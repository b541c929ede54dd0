"""`--model ORG/NAME`: a Hugging Face hub id is found in the local Hugging Face cache (never downloaded) by every
command that takes a model, and a model that is not there is one sentence saying how to fetch it.

The cache is a temporary directory laid out as huggingface_hub lays out a download (blobs, snapshots/<commit>
linking to them, refs/main), holding the tiny model's files; HF_HUB_CACHE points at it.
"""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from swarm.cli.main import main
from tasks.hub_cache import NotCached, cached_snapshot, parse_reference, write_snapshot

pytestmark = pytest.mark.usefixtures("one_torch_thread")

HUB_ID = "swarm-tests/tiny-chat"
COMMIT = "3b8a4c1d" * 5
MISSING = "Qwen/Qwen2.5-0.5B-Instruct"


@pytest.fixture
def hub_cache(tmp_path, tiny, monkeypatch) -> Path:
    """A Hugging Face cache holding the tiny model as HUB_ID; HF_HUB_CACHE names it."""
    cache = tmp_path / "hf-cache"
    files = {p.name: p.read_bytes() for p in Path(tiny.directory).iterdir() if p.is_file()}
    write_snapshot(parse_reference(HUB_ID), "model", files, cache, commit=COMMIT)
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return cache


@pytest.fixture
def empty_cache(tmp_path, monkeypatch) -> Path:
    cache = tmp_path / "empty-hf-cache"
    cache.mkdir()
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    return cache


def test_huggingface_hub_finds_the_same_snapshot_offline(hub_cache):
    """The oracle: huggingface_hub's own offline lookup resolves the id to the directory ours does."""
    from huggingface_hub import snapshot_download

    ours = cached_snapshot(parse_reference(HUB_ID), "model")
    theirs = snapshot_download(HUB_ID, cache_dir=hub_cache, local_files_only=True)
    assert Path(theirs) == ours == hub_cache / "models--swarm-tests--tiny-chat" / "snapshots" / COMMIT
    assert (ours / "model.safetensors").is_symlink()  # a real cache's layout: entries link into blobs/


def test_eval_scores_a_hub_model_from_the_local_cache(hub_cache, capsys):
    assert main(["eval", "--model", HUB_ID, "--task", "gcd", "--size", "40", "--n", "4", "--max-new-tokens", "2",
                 "--json"]) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert result["model"] == HUB_ID and result["n"] == 4


def test_train_starts_from_a_hub_model_and_its_policy_carries_the_hub_id(hub_cache, tmp_path, capsys):
    out = tmp_path / "run"
    config = tmp_path / "fast.toml"
    config.write_text('task_config = {max_value = 20}\ntask_size = 40\ncurriculum = "none"\nmax_new_tokens = 2\n'
                      'prompts_per_step = 2\ngroup_size = 2\nsteps_per_policy = 1\neval_n = 4\n')
    assert main(["train", "--model", HUB_ID, "--task", "gcd", "--config", str(config), "--steps", "1",
                 "--out", str(out), "--quiet"]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["steps"] == 1
    assert json.loads((out / "final" / "model.json").read_text())["name"] == HUB_ID


def _one_line_refusal(capsys, argv: list[str]) -> str:
    assert main(argv) == 2
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in captured.err, captured.err
    return lines[0]


@pytest.mark.parametrize("command", [
    ["eval"],
    ["train", "--out", "{tmp}/train-out"],
    ["sim", "--out", "{tmp}/sim-out"],
    ["peer", "start", "--role", "inference", "--data-dir", "{tmp}/peer", "--listen", "/ip4/127.0.0.1/tcp/0"],
    ["publish", MISSING, "--run", "r", "--key", "{tmp}/no-key", "--data-dir", "{tmp}/publisher"],
])
def test_a_model_missing_from_the_cache_is_one_sentence_saying_how_to_fetch_it(empty_cache, tmp_path, capsys,
                                                                                command):
    argv = [part.format(tmp=tmp_path) for part in command]
    if command[0] != "publish":
        argv += ["--model", MISSING]
    line = _one_line_refusal(capsys, argv)
    assert f"model {MISSING!r} is not an existing directory and not in the local Hugging Face cache" in line
    assert f"({empty_cache})" in line and f"`hf download {MISSING}`" in line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["empty-hf-cache"]  # a refused command creates nothing


def test_a_partly_cached_model_and_a_name_that_is_no_hub_id_are_each_one_sentence(empty_cache, capsys):
    write_snapshot(parse_reference("org/half"), "model", {"tokenizer.json": b"{}"}, empty_cache)
    line = _one_line_refusal(capsys, ["eval", "--model", "org/half"])
    assert "model 'org/half' is only partly in the local Hugging Face cache" in line and "no config.json" in line
    line = _one_line_refusal(capsys, ["eval", "--model", "not a/model id"])
    assert "is neither built in (tiny, tiny-sum, smollm2), an existing directory, nor a Hugging Face hub id" in line


@pytest.mark.parametrize("spec, parsed", [
    ("Qwen/Qwen2.5-0.5B-Instruct", ("Qwen/Qwen2.5-0.5B-Instruct", "main")),
    ("gpt2", ("gpt2", "main")),
    ("org/name@v1.0", ("org/name", "v1.0")),
    ("/abs/path", None), ("a/b/c", None), ("org/-bad", None), ("org/a--b", None), ("org/na..me", None),
    ("org/name@../../x", None), ("../x", None), ("", None),
])
def test_hub_ids_follow_huggingface_hubs_rule_and_paths_are_never_taken_for_one(spec, parsed):
    reference = parse_reference(spec)
    assert (None if reference is None else (reference.repo_id, reference.revision)) == parsed


def test_a_revision_is_looked_up_by_its_ref_and_a_ref_cannot_leave_the_repository(empty_cache):
    write_snapshot(parse_reference("org/name@v1"), "model", {"config.json": b"{}"}, empty_cache, commit="c" * 40)
    assert cached_snapshot(parse_reference("org/name@v1"), "model").name == "c" * 40
    for tampered in ("../../../etc", "..", "c" * 39):  # a ref naming anything but a snapshot of this repository
        (empty_cache / "models--org--name" / "refs" / "main").write_text(tampered)
        with pytest.raises(NotCached, match="org/name"):
            cached_snapshot(parse_reference("org/name"), "model")


def test_publish_seeds_a_hub_model_from_the_cache_named_by_its_id(hub_cache, tmp_path):
    """The real process: publish HUB_ID, wait for its 'published' event, interrupt it; the staged model.json names
    the hub id and the cache itself is left as it was."""
    from p2p.identity import Identity, write_key_file

    key = tmp_path / "trainer.key"
    write_key_file(key, Identity.generate())
    before = sorted((str(p), p.is_symlink()) for p in hub_cache.rglob("*"))
    proc = subprocess.Popen([sys.executable, "-m", "swarm", "publish", HUB_ID, "--run", "r", "--key", str(key),
                             "--json-events", "--data-dir", str(tmp_path / "publisher"), "--listen",
                             "/ip4/127.0.0.1/tcp/0"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=os.environ.copy())
    try:
        published = _first_event(proc, "published", within_s=120)
        proc.send_signal(signal.SIGINT)
        assert proc.wait(20) == 130
    finally:
        proc.kill()
    assert published["version"] == 1
    [staged] = (tmp_path / "publisher" / "staged").iterdir()
    assert json.loads((staged / "model.json").read_text())["name"] == HUB_ID
    assert sorted((str(p), p.is_symlink()) for p in hub_cache.rglob("*")) == before


def _first_event(proc: subprocess.Popen, kind: str, within_s: float) -> dict:
    lines: queue.Queue = queue.Queue()
    threading.Thread(target=lambda: [lines.put(line) for line in proc.stdout] and None, daemon=True).start()
    while True:
        try:
            line = lines.get(timeout=within_s)
        except queue.Empty:
            pytest.fail(f"no {kind!r} event within {within_s} s")
        event = json.loads(line) if line.startswith("{") else {}
        if event.get("event") == kind:
            return event
