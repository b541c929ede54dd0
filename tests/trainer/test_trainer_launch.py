"""`swarm train --nproc 2`: two data-parallel ranks under torchrun take the same steps as one process."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from safetensors.torch import load_file

from trainer.launch import rank_command

ROOT = Path(__file__).resolve().parents[2]
TRAIN = ["train", "--model", "tiny", "--task", "gcd", "--curriculum", "none", "--steps", "3", "--group-size", "4",
         "--prompts-per-step", "4", "--max-new-tokens", "3", "--lr", "1e-2", "--eval-n", "4", "--threads", "1",
         "--quiet"]
LAUNCHES_WITHIN_S = 540  # a bound on all of this module's launches on a busy 2-core machine, not a speed target


def test_rank_command_runs_the_same_words_without_nproc_under_torchrun():
    command = rank_command(3, ["train", "--nproc", "3", "--steps", "2", "--nproc=3", "--quiet"])
    assert command[1:5] == ["-m", "torch.distributed.run", "--standalone", "--nproc-per-node=3"]
    assert command[5:] == ["-m", "swarm", "train", "--steps", "2", "--quiet"]


class Launch:
    """A `swarm` command started in the background, its output in files (a pipe nobody reads could fill up)."""

    def __init__(self, args: list[str], cache: Path, logs: Path) -> None:
        env = {**os.environ, "SWARM_MODEL_CACHE": str(cache)}
        env.pop("WORLD_SIZE", None)
        self.stdout_path, self.stderr_path = logs.with_suffix(".out"), logs.with_suffix(".err")
        with open(self.stdout_path, "w") as stdout, open(self.stderr_path, "w") as stderr:
            self.popen = subprocess.Popen([sys.executable, "-m", "swarm", *args], cwd=ROOT, env=env, stdout=stdout,
                                          stderr=stderr, text=True)

    def finish(self, deadline: float) -> subprocess.CompletedProcess:
        """Wait for the command until `deadline` (time.monotonic()); what it printed."""
        code = self.popen.wait(timeout=max(1.0, deadline - time.monotonic()))
        return subprocess.CompletedProcess(self.popen.args, code, self.stdout_path.read_text(),
                                           self.stderr_path.read_text())


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Every run this module compares, by name: "one", the reference, is one process training the same steps; it
    is this process (`swarm train` without --nproc runs in the calling process), so it needs no interpreter of its
    own to import torch into, and the thread count it sets is put back. The launches start two at a time and the
    reference trains meanwhile: each launch spends much of its time in one process (torchrun's start, rank 0's
    generation and evaluation while rank 1 waits), so two share the cores that one leaves idle."""
    import torch

    from inference.models import load_model
    from swarm.cli.main import main

    root = tmp_path_factory.mktemp("launch")
    cache = root / "cache"
    load_model("tiny", cache_dir=cache)  # built once, read by every process of this module
    fsdp = [*TRAIN, "--nproc", "2", "--parallel", "fsdp", "--out", str(root / "fsdp")]
    deadline = time.monotonic() + LAUNCHES_WITHIN_S
    started = {
        "two": Launch([*TRAIN, "--nproc", "2", "--out", str(root / "two")], cache, root / "two"),
        "fsdp first": Launch([*fsdp, "--steps", "2", "--eval-every", "1"], cache, root / "fsdp-first"),
    }
    done = {}
    try:
        threads = torch.get_num_threads()
        with pytest.MonkeyPatch.context() as patch:
            patch.setenv("SWARM_MODEL_CACHE", str(cache))
            patch.delenv("WORLD_SIZE", raising=False)
            try:
                assert main([*TRAIN, "--out", str(root / "one")]) == 0
            finally:
                torch.set_num_threads(threads)
        done["fsdp first"] = started["fsdp first"].finish(deadline)
        started["fsdp resumed"] = Launch([*fsdp, "--steps", "3"], cache, root / "fsdp-resumed")
        done["two"] = started["two"].finish(deadline)
        started["async"] = Launch([*TRAIN, "--nproc", "2", "--async-level", "1", "--out", str(root / "async")],
                                  cache, root / "async")
        for name in ("fsdp resumed", "async"):
            done[name] = started[name].finish(deadline)
    finally:
        for launch in started.values():  # those still running when something failed
            launch.popen.kill()
            launch.popen.wait()
    return root, cache, done


def _assert_same_training(one: Path, two: Path) -> None:
    """Two runs took the same steps: rewards, batch figures and gradient norms per step, and final weights."""
    logs = [[json.loads(line) for line in (run / "log.jsonl").read_text().splitlines()] for run in (one, two)]
    assert [r["reward"] for r in logs[0]] == pytest.approx([r["reward"] for r in logs[1]], abs=1e-9)
    assert [r["grad_norm"] for r in logs[0]] == pytest.approx([r["grad_norm"] for r in logs[1]], rel=1e-4)
    # the log shows the whole batch, not rank 0's half
    assert [(r["groups"], r["groups_trained"], r["tokens"]) for r in logs[0]] == \
        [(r["groups"], r["groups_trained"], r["tokens"]) for r in logs[1]]
    assert [r["loss"] for r in logs[0]] == pytest.approx([r["loss"] for r in logs[1]], rel=1e-4, abs=1e-7)
    assert [r["entropy"] for r in logs[0]] == pytest.approx([r["entropy"] for r in logs[1]], rel=1e-4)
    first, second = (load_file(str(run / "final" / "model.safetensors")) for run in (one, two))
    assert first.keys() == second.keys()
    for name in first:
        if not name.endswith("k_proj.bias"):  # zero gradient in exact arithmetic: see test_trainer_distributed
            assert (first[name] - second[name]).abs().max() < 1e-4, name


@pytest.mark.timeout(600)  # its set-up is every launch of the module (`runs`)
def test_two_ranks_train_like_one_process(runs):
    """Rank 0 generates and broadcasts each batch, each rank trains on half of it and the gradients are summed:
    the same rewards per step and the same final weights as one process on the whole batch; one summary line."""
    root, _, done = runs
    pair = done["two"]
    assert pair.returncode == 0, pair.stderr[-8000:]
    summaries = [json.loads(line) for line in pair.stdout.splitlines() if line.startswith("{")]
    assert len(summaries) == 1 and summaries[0]["steps"] == 3  # rank 0 alone reports
    _assert_same_training(root / "one", root / "two")


@pytest.mark.timeout(600)
def test_two_fsdp_ranks_train_and_resume_like_one_process(runs):
    """--parallel fsdp: weights and AdamW state sharded over two ranks. Two steps with a held-out evaluation between
    them (on gathered weights, rank 0 alone), a restart that resumes from the gathered checkpoint, a third step:
    the same steps and final weights as one process, and a final policy that loads like any other."""
    from inference.models import load_model

    root, cache, done = runs
    out = root / "fsdp"
    first, resumed = done["fsdp first"], done["fsdp resumed"]
    assert first.returncode == 0, first.stderr[-8000:]
    assert resumed.returncode == 0, resumed.stderr[-8000:]
    assert json.loads(resumed.stdout.splitlines()[-1])["steps"] == 3
    _assert_same_training(root / "one", out)
    evaluated = [json.loads(line)["step"] for line in (out / "eval.jsonl").read_text().splitlines()]
    assert evaluated == [0, 1, 2, 2, 3]  # the first session: before, between, after; the second: before, after
    assert load_model(str(out / "final"), cache_dir=cache).model.config.hidden_size > 0


def test_fsdp_needs_several_ranks(tmp_path, capsys):
    from swarm.cli.main import main

    assert main([*TRAIN, "--parallel", "fsdp", "--out", str(tmp_path)]) == 2
    assert "--nproc 2 or more" in capsys.readouterr().err


@pytest.mark.timeout(600)
def test_two_ranks_train_asynchronously_with_rank_0s_generator_process(runs):
    """With --async-level, rank 0 owns a generator process; every batch is broadcast and stays inside the window."""
    root, _, done = runs
    assert done["async"].returncode == 0, done["async"].stderr[-8000:]
    log = [json.loads(line) for line in (root / "async" / "log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in log] == [0, 1, 2] and all(r["max_lag"] <= 1 and r["refused"] == 0 for r in log)
    assert (root / "async" / "final" / "model.safetensors").is_file()


def test_a_generator_thread_cannot_serve_several_ranks(tmp_path, capsys):
    from swarm.cli.main import main

    assert main([*TRAIN, "--nproc", "2", "--async-level", "1", "--generator", "thread", "--out", str(tmp_path)]) == 2
    assert "needs the generator process" in capsys.readouterr().err
