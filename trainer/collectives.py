"""The collectives the GRPO step (trainer/step.py) runs across data-parallel ranks: plain all-reduce of the
gradients (TorchCollective) or none, because FSDP already reduce-scattered them (FsdpCollective).

Why a module of its own: trainer.distributed picks one of them when a rank joins its group, and the sharded step
(trainer.fsdp_step) insists on the FSDP one; both build on this module rather than on each other.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.distributed as dist

from trainer.errors import TrainerError


class TorchCollective:
    """The `Collective` of trainer.step over an initialised default process group."""

    def __init__(self) -> None:
        if not dist.is_initialized():
            raise TrainerError("data parallelism needs torch.distributed to be initialised first")
        self.dist = dist
        self.rank, self.world_size = dist.get_rank(), dist.get_world_size()
        self.device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else None

    def _reduce(self, value: float, op) -> float:
        tensor = torch.tensor([value], dtype=torch.float64, device=self.device)
        self.dist.all_reduce(tensor, op=op)
        return float(tensor.item())

    def all_sum(self, value: float) -> float:
        return self._reduce(value, self.dist.ReduceOp.SUM)

    def all_max(self, value: float) -> float:
        return self._reduce(value, self.dist.ReduceOp.MAX)

    def reduce_gradients(self, parameters: Sequence[torch.nn.Parameter]) -> None:
        """Sum every gradient across ranks in one flat buffer (a rank with no rows contributes zeros)."""
        params = [p for p in parameters if p.requires_grad]
        for p in params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        flat = torch.cat([p.grad.reshape(-1) for p in params])
        self.dist.all_reduce(flat, op=self.dist.ReduceOp.SUM)
        offset = 0
        for p in params:
            n = p.grad.numel()
            p.grad.copy_(flat[offset:offset + n].view_as(p.grad))
            offset += n


class FsdpCollective(TorchCollective):
    """The collective of a sharded model: FSDP's reduce-scatter already summed the gradients during backward."""

    lockstep = True  # read by trainer.step: every rank must enter each pass phase, even with no rows of its own

    def reduce_gradients(self, parameters: Sequence[torch.nn.Parameter]) -> None:
        return None
