"""`swarm train --nproc 2`: two data-parallel ranks under torchrun take the same steps as one process."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from safetensors.torch import load_file

from trainer.launch import rank_command

ROOT = Path(__file__).resolve().parent.parent
TRAIN = ["train", "--model", "tiny", "--task", "gcd", "--curriculum", "none", "--steps", "3", "--group-size", "4",
         "--prompts-per-step", "4", "--max-new-tokens", "3", "--lr", "1e-2", "--eval-n", "4", "--threads", "1",
         "--quiet"]


def test_rank_command_runs_the_same_words_without_nproc_under_torchrun():
    command = rank_command(3, ["train", "--nproc", "3", "--steps", "2", "--nproc=3", "--quiet"])
    assert command[1:5] == ["-m", "torch.distributed.run", "--standalone", "--nproc-per-node=3"]
    assert command[5:] == ["-m", "swarm", "train", "--steps", "2", "--quiet"]


def _swarm(args, cache: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "SWARM_MODEL_CACHE": str(cache)}
    env.pop("WORLD_SIZE", None)
    return subprocess.run([sys.executable, "-m", "swarm", *args], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=300)


@pytest.fixture(scope="module")
def single_run(tmp_path_factory):
    """(model cache, output directory) of the reference: one process training the same steps. That process is this
    one (`swarm train` without --nproc runs in the calling process): the reference needs no interpreter of its own
    to import torch into, and the thread count it sets is put back."""
    import torch

    from inference.models import load_model
    from swarm.cli.main import main

    root = tmp_path_factory.mktemp("launch")
    cache = root / "cache"
    load_model("tiny", cache_dir=cache)  # built once, read by every process of this module
    threads = torch.get_num_threads()
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("SWARM_MODEL_CACHE", str(cache))
        patch.delenv("WORLD_SIZE", raising=False)
        try:
            assert main([*TRAIN, "--out", str(root / "one")]) == 0
        finally:
            torch.set_num_threads(threads)
    return cache, root / "one"


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


def test_two_ranks_train_like_one_process(single_run, tmp_path):
    """Rank 0 generates and broadcasts each batch, each rank trains on half of it and the gradients are summed:
    the same rewards per step and the same final weights as one process on the whole batch; one summary line."""
    cache, one = single_run
    pair = _swarm([*TRAIN, "--nproc", "2", "--out", str(tmp_path / "two")], cache)
    assert pair.returncode == 0, pair.stderr[-8000:]
    summaries = [json.loads(line) for line in pair.stdout.splitlines() if line.startswith("{")]
    assert len(summaries) == 1 and summaries[0]["steps"] == 3  # rank 0 alone reports
    _assert_same_training(one, tmp_path / "two")


def test_two_fsdp_ranks_train_and_resume_like_one_process(single_run, tmp_path):
    """--parallel fsdp: weights and AdamW state sharded over two ranks. Two steps with a held-out evaluation between
    them (on gathered weights, rank 0 alone), a restart that resumes from the gathered checkpoint, a third step:
    the same steps and final weights as one process, and a final policy that loads like any other."""
    from inference.models import load_model

    cache, one = single_run
    out = tmp_path / "fsdp"
    fsdp = [*TRAIN, "--nproc", "2", "--parallel", "fsdp", "--out", str(out)]
    first = _swarm([*fsdp, "--steps", "2", "--eval-every", "1"], cache)
    assert first.returncode == 0, first.stderr[-8000:]
    resumed = _swarm([*fsdp, "--steps", "3"], cache)
    assert resumed.returncode == 0, resumed.stderr[-8000:]
    assert json.loads(resumed.stdout.splitlines()[-1])["steps"] == 3
    _assert_same_training(one, out)
    evaluated = [json.loads(line)["step"] for line in (out / "eval.jsonl").read_text().splitlines()]
    assert evaluated == [0, 1, 2, 2, 3]  # the first session: before, between, after; the second: before, after
    assert load_model(str(out / "final"), cache_dir=cache).model.config.hidden_size > 0


def test_fsdp_needs_several_ranks(tmp_path, capsys):
    from swarm.cli.main import main

    assert main([*TRAIN, "--parallel", "fsdp", "--out", str(tmp_path)]) == 2
    assert "--nproc 2 or more" in capsys.readouterr().err


def test_two_ranks_train_asynchronously_with_rank_0s_generator_process(single_run, tmp_path):
    """With --async-level, rank 0 owns a generator process; every batch is broadcast and stays inside the window."""
    cache, _ = single_run
    done = _swarm([*TRAIN, "--nproc", "2", "--async-level", "1", "--out", str(tmp_path / "async")], cache)
    assert done.returncode == 0, done.stderr[-8000:]
    log = [json.loads(line) for line in (tmp_path / "async" / "log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in log] == [0, 1, 2] and all(r["max_lag"] <= 1 and r["refused"] == 0 for r in log)
    assert (tmp_path / "async" / "final" / "model.safetensors").is_file()


def test_a_generator_thread_cannot_serve_several_ranks(tmp_path, capsys):
    from swarm.cli.main import main

    assert main([*TRAIN, "--nproc", "2", "--async-level", "1", "--generator", "thread", "--out", str(tmp_path)]) == 2
    assert "needs the generator process" in capsys.readouterr().err
