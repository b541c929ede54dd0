"""Data parallelism with gloo on the CPU: two ranks, gradients summed, identical weights equal to one process."""

import os
import random
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from trainer.distributed import init_data_parallel, shard
from trainer.errors import TrainerError

LAUNCH = ("import sys; sys.path.insert(0, sys.argv[2]); from test_trainer_distributed import train_shard; "
          "train_shard(sys.argv[1])")


def train_shard(out: str) -> None:
    """Two GRPO steps on this rank's share of a fixed batch; saves the resulting weights to `out`."""
    from inference.models import load_model
    from trainer.config import load_config
    from trainer.step import PolicyTrainer, TrainGroup

    rank, world = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    collective = init_data_parallel("gloo") if world > 1 else None
    torch.set_num_threads(1)
    loaded = load_model("tiny")
    cfg = load_config(overrides=dict(lr=1e-2, warmup_steps=1, micro_batch=3, grad_clip=1.0)).config
    trainer = PolicyTrainer(loaded.model, cfg, pad_id=0, collective=collective)
    trainer.mark_published(0)
    for step in range(2):
        rng = random.Random(step)
        groups = []
        for g in range(4):
            comps = tuple(tuple(rng.randrange(5, 60) for _ in range(rng.randint(2, 6))) for _ in range(3))
            rewards = tuple(float(rng.random() < 0.5) for _ in comps)
            groups.append(TrainGroup(f"{step}-{g}", 0, (10 + g, 11, 12), comps, rewards, 1.0, 6))
        report = trainer.train_step(step, shard(groups, rank, world))
        assert not report.skipped, report
    save_file({k: v.contiguous() for k, v in loaded.model.state_dict().items() if k != "lm_head.weight"}, out)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_gloo_ranks_match_one_process_on_the_full_batch(tmp_path, monkeypatch):
    cache, port = tmp_path / "cache", _free_port()
    monkeypatch.setenv("SWARM_MODEL_CACHE", str(cache))
    from inference.models import load_model

    initial = load_model("tiny").model.state_dict()  # builds the cache the ranks share
    env = {**os.environ, "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
    ranks = [subprocess.Popen([sys.executable, "-c", LAUNCH, str(tmp_path / f"rank{r}.st"), str(Path(__file__).parent)],
                              env={**env, "RANK": str(r)}, stderr=subprocess.PIPE, text=True) for r in range(2)]
    threads = torch.get_num_threads()
    try:
        train_shard(str(tmp_path / "single.st"))  # the whole batch in this process meanwhile
    finally:
        torch.set_num_threads(threads)
    for proc in ranks:
        assert proc.wait(timeout=240) == 0, proc.stderr.read()[-2000:]
    r0, r1, one = (load_file(str(tmp_path / name)) for name in ("rank0.st", "rank1.st", "single.st"))
    assert all(torch.equal(r0[k], r1[k]) for k in r0)  # the ranks never diverge
    assert all(torch.allclose(r0[k], one[k], atol=1e-5) for k in r0)  # summed shards == the whole batch
    assert not torch.allclose(r0["model.norm.weight"], initial["model.norm.weight"])  # and training moved them


def test_shard_splits_round_robin():
    assert shard(list(range(7)), 1, 3) == [1, 4]
    assert sorted(shard(list(range(7)), 0, 2) + shard(list(range(7)), 1, 2)) == list(range(7))


def test_guards_name_the_missing_piece(monkeypatch):
    if not torch.cuda.is_available():
        with pytest.raises(TrainerError, match="nccl backend needs CUDA"):
            init_data_parallel("nccl")
    with pytest.raises(TrainerError, match="unknown distributed backend"):
        init_data_parallel("mpi")
    for key in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(key, raising=False)
    with pytest.raises(TrainerError, match="needs RANK in the environment"):
        init_data_parallel("gloo")
