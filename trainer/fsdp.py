"""Sharded data parallelism (FSDP2 `fully_shard`): each rank keeps 1/world of the weights, grads and AdamW state.

Why FSDP beside plain all-reduce (trainer.distributed): all-reduce needs the whole model, its gradients and two
AdamW moments on every rank (16 bytes a parameter); sharding divides that by the world size, which is what lets
PRIME-RL train 32B models. The maths is unchanged: the loss is divided by the global constant, so the gradient
reduce-scatter must *sum* (FSDP averages by default; `apply_fsdp` sets the divide factor to 1 and forces a plain
SUM, the only reduction gloo offers), and AdamW acting elementwise on shards takes the same step as on the whole.

The shard plan, and why it is not "root only": every transformer block is one unit (its weights are gathered just
before it runs and freed after), the embeddings, final norm and LM head form one unit (a tied head shares the
embedding matrix, so the two must live in one unit), and the causal-LM module is the root. The trainer's loss
calls the base model and the head directly (logits at completion positions only, trainer.step), never the root's
forward; FSDP picks its root on the first forward, so `apply_fsdp` runs one 1-token forward through the root to
settle it, and the grouped unit's gradients are then reduced by the root's end-of-backward callback.

Every forward of the live model is a collective (it all-gathers weights), so all ranks must run the same number of
passes in the same order: trainer.fsdp_step keeps them in lockstep. Weights leave the shards only through
`full_state_dict` (every rank, a collective), for published policies, version snapshots and checkpoints.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_optimizer_state_dict,
    set_state_dict,
)
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor

from trainer.checkpoint import load_checkpoint, save_checkpoint
from trainer.errors import TrainerError

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


@dataclass(frozen=True)
class FsdpPrecision:
    """Mixed precision of the sharded model; the sharded master weights and AdamW state stay in their own dtype."""

    param_dtype: str = "float32"  # dtype of the gathered weights the forward/backward compute with
    reduce_dtype: str = "float32"  # dtype of the gradient reduce-scatter (fp32 keeps the sum exact across ranks)

    def validate(self) -> "FsdpPrecision":
        for name in ("param_dtype", "reduce_dtype"):
            if getattr(self, name) not in DTYPES:
                raise TrainerError(f"FSDP {name} must be one of {', '.join(DTYPES)}, got {getattr(self, name)!r}")
        return self


def default_precision(device_type: str) -> FsdpPrecision:
    """bf16 compute on GPUs (PRIME-RL's policy: half the all-gather bytes, fp32 gradient sums); fp32 on CPUs,
    where bf16 matmuls are slow and the tests compare against fp32 single-process training."""
    return FsdpPrecision("bfloat16", "float32") if device_type == "cuda" else FsdpPrecision()


def shard_plan(model) -> list[tuple[str, ...]]:
    """The FSDP units, innermost first, as tuples of submodule names ("" is the root).

    One unit per decoder block, then the embeddings + final norm + LM head together, then the root.
    """
    blocks = _decoder_blocks(model)
    base = model.base_model_prefix
    head = _child_name(model, model.get_output_embeddings())
    return [(f"{base}.layers.{i}",) for i in range(len(blocks))] + [(base, head), ("",)]


def _decoder_blocks(model):
    layers = getattr(model.base_model, "layers", None)
    if not isinstance(layers, torch.nn.ModuleList) or len(layers) == 0:
        raise TrainerError(f"FSDP needs a decoder with a `layers` list; {type(model).__name__} has none")
    return layers


def _child_name(model, child) -> str:
    for name, module in model.named_children():
        if module is child:
            return name
    raise TrainerError(f"the output embeddings of {type(model).__name__} are not a direct child of the model")


def apply_fsdp(model, precision: FsdpPrecision | None = None, mesh=None):
    """Shard `model` in place over the default process group (or `mesh`); returns it.

    Build the optimizer AFTER this call: sharding replaces every parameter with a DTensor shard.
    """
    if not dist.is_initialized():
        raise TrainerError("FSDP needs torch.distributed to be initialised first")
    device_type = "cuda" if dist.get_backend() == "nccl" else "cpu"
    precision = (precision or default_precision(device_type)).validate()
    mesh = mesh or init_device_mesh(device_type, (dist.get_world_size(),))
    policy = MixedPrecisionPolicy(param_dtype=DTYPES[precision.param_dtype],
                                  reduce_dtype=DTYPES[precision.reduce_dtype])
    units = []
    for names in shard_plan(model):
        modules = [model.get_submodule(name) for name in names]
        fully_shard(modules if len(modules) > 1 else modules[0], mesh=mesh, mp_policy=policy)
        units.append(modules[0])  # a grouped unit's settings live on its first module
    for unit in units:
        unit.set_gradient_divide_factor(1.0)  # sum, not mean: the loss is already globally normalised
        unit.set_force_sum_reduction_for_comms(True)  # gloo has no PREMUL_SUM; NCCL's SUM is zero-copy
    _settle_root(model, device_type)
    return model


@torch.no_grad()
def _settle_root(model, device_type: str) -> None:
    """One 1-token forward through the root so FSDP makes it the root (see the module docstring)."""
    device = torch.device("cuda", torch.cuda.current_device()) if device_type == "cuda" else torch.device("cpu")
    was_training = model.training
    model.eval()
    model(input_ids=torch.zeros((1, 1), dtype=torch.long, device=device), use_cache=False)
    model.train(was_training)


def is_sharded(model) -> bool:
    return isinstance(model, FSDPModule)


@torch.no_grad()
def full_state_dict(model) -> dict[str, torch.Tensor]:
    """The whole model's weights as plain CPU tensors on EVERY rank (a collective: all ranks must call it).

    For a model that is not sharded it is a detached CPU copy of state_dict(), so callers need no branch.
    """
    out = {}
    for name, value in model.state_dict().items():
        full = value.full_tensor() if isinstance(value, DTensor) else value
        out[name] = full.detach().to("cpu", copy=True)
    return out


def unsharded_copy(model, state: dict[str, torch.Tensor] | None = None):
    """A plain (unsharded) module of the same architecture holding `state` (default: gathered now, a collective).

    Why a module and not a dict: trainer.checkpoint writes policies with `save_pretrained` and checkpoints with
    safetensors' `save_model`, so handing them this copy writes exactly the files a single process would write.
    Built on the meta device and filled with `assign=True`, it adds no memory beyond the gathered tensors.
    """
    state = full_state_dict(model) if state is None else state
    with torch.device("meta"):
        clone = type(model)(model.config)
    clone.load_state_dict(state, strict=True, assign=True)
    if getattr(model.config, "tie_word_embeddings", False):
        clone.tie_weights()
    _copy_unsaved_buffers(model, clone)
    return clone.eval()


def _copy_unsaved_buffers(model, clone) -> None:
    """Give the clone the buffers a state dict leaves out (e.g. rotary inv_freq, computed at init): without them
    it could be written to disk but not run. FSDP never shards buffers, so every rank holds them whole."""
    for name, buffer in model.named_buffers():
        owner, _, leaf = name.rpartition(".")
        module = clone.get_submodule(owner) if owner else clone
        if module._buffers.get(leaf) is not None and module._buffers[leaf].is_meta:
            module._buffers[leaf] = buffer.detach().to("cpu", copy=True)


class OptimizerState:
    """Stands in for the optimizer in trainer.checkpoint's save/load: holds a full (gathered) state dict."""

    def __init__(self, state: dict | None = None) -> None:
        self.state = state

    def state_dict(self) -> dict:
        return self.state

    def load_state_dict(self, state: dict) -> None:
        self.state = state


@dataclass
class CheckpointView:
    """What trainer.checkpoint reads or writes in place of a sharded model and its optimizer.

    Saving: `gather_checkpoint` on every rank (collective), then rank 0 calls
    `save_checkpoint(root, view.model, view.optimizer, scheduler, state)`. Loading: `empty_checkpoint(model)` on
    every rank, `load_checkpoint(path, view.model, view.optimizer, scheduler)`, then `view.scatter_into(...)`.
    The optimizer state is keyed by parameter names (torch.distributed.checkpoint's full format), so an FSDP
    checkpoint resumes under FSDP with any world size.
    """

    model: torch.nn.Module
    optimizer: OptimizerState

    def scatter_into(self, model, optimizer) -> None:
        """Load the full weights and optimizer state into the sharded model and optimizer (every rank)."""
        set_state_dict(model, optimizer, model_state_dict=self.model.state_dict(),
                       optim_state_dict=self.optimizer.state, options=StateDictOptions(full_state_dict=True))


def gather_checkpoint(model, optimizer) -> CheckpointView:
    """Full weights and full optimizer state on every rank (a collective), ready for save_checkpoint on rank 0."""
    optim = get_optimizer_state_dict(model, optimizer, options=StateDictOptions(full_state_dict=True))
    return CheckpointView(unsharded_copy(model), OptimizerState(_to_cpu(optim)))


def empty_checkpoint(model) -> CheckpointView:
    """A view that load_checkpoint fills: a plain model of the same architecture and an empty optimizer state.

    The model is allocated uninitialised (meta, then empty CPU storage): every saved tensor is overwritten by the
    load, and only the saved tensors are scattered back, so a random initialisation would be wasted time.
    """
    with torch.device("meta"):
        clone = type(model)(model.config)
    clone = clone.to_empty(device="cpu").to(next(model.parameters()).dtype)
    if getattr(model.config, "tie_word_embeddings", False):
        clone.tie_weights()
    return CheckpointView(clone, OptimizerState())


def _to_cpu(tree):
    if isinstance(tree, torch.Tensor):
        return tree.detach().to("cpu", copy=True)
    if isinstance(tree, dict):
        return {k: _to_cpu(v) for k, v in tree.items()}
    if isinstance(tree, list):
        return [_to_cpu(v) for v in tree]
    return tree


class ShardedWeights:
    """trainer.checkpoint.WholeWeights for a sharded model: every method is a collective (all ranks call it)."""

    def publishable(self, model) -> tuple[torch.nn.Module, dict]:
        """A plain module holding the gathered weights, and those weights (the trainer keeps them as the
        version's snapshot, so a publication gathers once)."""
        weights = full_state_dict(model)
        return unsharded_copy(model, weights), weights

    def save(self, root, model, optimizer, scheduler, state, *, write: bool):
        """Gather the weights and AdamW state on every rank; rank 0 (`write`) writes them as one checkpoint."""
        view = gather_checkpoint(model, optimizer)
        return save_checkpoint(root, view.model, view.optimizer, scheduler, state) if write else None

    def load(self, path, model, optimizer, scheduler):
        """Every rank reads the full checkpoint and keeps its own shards of the weights and AdamW state."""
        view = empty_checkpoint(model)
        state = load_checkpoint(path, view.model, view.optimizer, scheduler)
        view.scatter_into(model, optimizer)
        return state
