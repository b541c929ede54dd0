"""Data parallelism over torch.distributed: each rank trains on its share of the batch, gradients are summed.

Why a sum and not a mean: the GRPO loss is already divided by the *global* constant (all ranks' completions x
max tokens, agreed with `all_sum`/`all_max`), so summing per-rank gradients gives exactly the full-batch gradient,
whatever the split; AdamW then takes the same step on every rank and the weights stay identical.

Two modes: "ddp" keeps the whole model on every rank and all-reduces the gradients once per step (trainer.collectives);
"fsdp" shards weights, gradients and optimizer state across ranks (trainer.fsdp, trainer.fsdp_step), for models
whose training state does not fit one device. Backends: "gloo" on CPUs (both modes tested with two processes),
"nccl" for FSDP on GPUs (one process per GPU launched by torchrun; chosen automatically when CUDA is available;
guarded, not exercised by the CPU test suite). "ddp" always runs on gloo: its model stays on the CPU, next to the
torch generation backend it shares weights with.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import torch

# torch._dynamo is imported here, before any process group exists, so that `destroy_process_group` really ends the
# group: imported after the group started (transformers' model loading and FSDP both import it), it keeps
# references to the default group (ten, in torch 2.13), and `destroy_process_group` then only forgets the group:
# its gloo threads live on into interpreter shutdown, where tearing them down can abort a rank ("terminate called
# without an active exception", SIGABRT) after a run that has finished well. tests/trainer/test_trainer_distributed.py
# checks that no gloo thread outlives the group. Under FSDP the group still outlives its destruction: DTensor's
# sharding caches (torch internals, no public way to clear them) hold its device mesh.
import torch._dynamo  # noqa: F401 - imported for its side effect on what it captures
import torch.distributed as dist

from trainer.collectives import FsdpCollective, TorchCollective
from trainer.config import PARALLEL_MODES
from trainer.errors import TrainerError


def default_backend(mode: str) -> str:
    """nccl for FSDP when this process can see a GPU (the shards live there), gloo otherwise: in "ddp" mode the
    whole model stays on the CPU, and NCCL cannot reduce CPU tensors."""
    return "nccl" if mode == "fsdp" and torch.cuda.is_available() else "gloo"


def init_data_parallel(backend: str | None = None, mode: str = "ddp") -> TorchCollective:
    """Join the process group described by torchrun's environment (RANK, WORLD_SIZE, MASTER_ADDR/PORT)."""
    backend = backend or default_backend(mode)
    if backend not in ("gloo", "nccl"):
        raise TrainerError(f"unknown distributed backend {backend!r}: choose gloo (CPU) or nccl (GPU)")
    if backend == "nccl" and not torch.cuda.is_available():
        raise TrainerError("the nccl backend needs CUDA GPUs; use gloo on CPUs")
    if backend == "nccl" and mode == "ddp":
        raise TrainerError("ddp keeps the model on the CPU, which nccl cannot reduce; use gloo, or --parallel fsdp "
                           "to train on GPUs")
    missing = [k for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT") if k not in os.environ]
    if missing:
        raise TrainerError(f"data parallelism needs {missing[0]} in the environment (launch with torchrun)")
    if backend == "nccl":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    if not dist.is_initialized():
        dist.init_process_group(backend=backend)
    return TorchCollective()


def end_data_parallel() -> None:
    """Destroy the default process group (every rank, once its last collective is done)."""
    if dist.is_initialized():
        dist.destroy_process_group()


def init_parallel(mode: str = "ddp", backend: str | None = None) -> TorchCollective:
    """The collective for `mode`: "ddp" (gradients all-reduced by the step) or "fsdp" (reduced by FSDP itself;
    the model must then be sharded with trainer.fsdp.apply_fsdp and trained by trainer.fsdp_step)."""
    if mode not in PARALLEL_MODES:
        raise TrainerError(f"unknown parallel mode {mode!r}: choose ddp or fsdp")
    init_data_parallel(backend, mode)
    if mode == "ddp":
        return TorchCollective()
    return FsdpCollective()


def shard(items: Sequence, rank: int, world_size: int) -> list:
    """This rank's share of a batch: every world_size-th item starting at rank."""
    return list(items[rank::world_size])
