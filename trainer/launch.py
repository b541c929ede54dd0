"""`swarm train --nproc N`: the same session on N local processes, data parallel over torch.distributed.

Why through torchrun (`torch.distributed.run --standalone`): it is how data-parallel PyTorch jobs are launched on
GPU machines too, so one code path serves `--nproc` here and `torchrun --nproc-per-node N -m swarm train ...` on a
GPU node; it picks a free rendezvous port on this machine and ends every rank if one fails. Each rank then sees
RANK / WORLD_SIZE / MASTER_ADDR / MASTER_PORT and joins the group (trainer.distributed). Rank 0 owns the
generator (in-process, or with --async-level a spawned generator process: a fork after the process group started
could inherit its threads' locks), the evaluations, the log, the published policies and the checkpoints; each batch
it takes is broadcast, every rank trains on its share (every world_size-th group) and the gradients are summed, so
the step is the whole batch's step (trainer.distributed says why a sum). With `--parallel fsdp` each rank holds a
shard of the weights and AdamW state instead (trainer.fsdp); publishing, checkpointing and evaluating then gather
the full weights on every rank (trainer.fsdp.ShardedWeights) and rank 0 writes or evaluates them.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Sequence

import torch.distributed as dist

from trainer.errors import TrainerError


def check_supported(cfg) -> None:
    """What data-parallel training cannot do yet, in one line (checked before launching and in every rank)."""
    if cfg.async_level and cfg.generator != "process":
        raise TrainerError(
            "data-parallel async training (--nproc > 1) needs the generator process (--generator process)"
        )
    if cfg.device == "cuda" and cfg.parallel == "ddp":
        raise TrainerError("--device cuda does not apply to --nproc with ddp, which trains on the CPU; use --parallel "
                           "fsdp to train on the GPUs")


def world_size() -> int:
    """Processes in this training job (1 unless launched by torchrun)."""
    try:
        return max(1, int(os.environ.get("WORLD_SIZE", "1")))
    except ValueError:
        raise TrainerError(f"WORLD_SIZE must be a number, got {os.environ['WORLD_SIZE']!r}") from None


def rank_command(nproc: int, argv: Sequence[str]) -> list[str]:
    """torchrun running `swarm <argv>` (with --nproc removed) on `nproc` local ranks."""
    words, skip = [], False
    for word in argv:
        if skip:
            skip = False
        elif word == "--nproc":
            skip = True
        elif not word.startswith("--nproc="):
            words.append(word)
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
            "-m", "swarm", *words]


def launch_ranks(nproc: int, argv: Sequence[str]) -> int:
    """Run the ranks to completion; their exit status (torchrun ends them all when one fails)."""
    if nproc > (os.cpu_count() or 1) * 4:
        raise TrainerError(f"--nproc {nproc} is far more processes than this machine has cores")
    # a rank that aborts in C++ (SIGABRT, SIGSEGV) still prints where its Python threads were
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"),
           "PYTHONFAULTHANDLER": os.environ.get("PYTHONFAULTHANDLER", "1")}
    return subprocess.run(rank_command(nproc, argv), env=env).returncode


def broadcast_batch(collective, groups: list | None) -> list:
    """Rank 0's batch on every rank (the others pass None)."""
    box = [groups if collective.rank == 0 else None]
    dist.broadcast_object_list(box, src=0)
    return box[0]
