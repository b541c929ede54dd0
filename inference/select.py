"""Choosing a generation backend and a compute device by name, for peers and commands that take them as flags.

Why here: `swarm peer start` must refuse a misspelt backend or an unavailable GPU in one sentence before it joins a
swarm, and the roles must not each grow their own import-and-check logic for the optional vLLM extra.
"""

from __future__ import annotations

import importlib.util

import torch

from inference.backend import GenerationBackend
from inference.errors import InferenceError
from inference.models import LoadedModel
from inference.torch_backend import TorchBackend
from inference.vllm_backend import VllmBackend


def open_backend(name: str, loaded: LoadedModel, precision: str = "float32",
                 gpu_memory: float = 0.3) -> GenerationBackend:
    """The named backend over `loaded`: torch (the CPU reference, any machine; it generates in the loaded
    model's float32, which every precision's tolerances accept) or vllm (the gpu extra), in `precision`, taking
    at most `gpu_memory` of the GPU."""
    require_backend(name)
    if name == "torch":
        return TorchBackend(loaded)
    return VllmBackend(loaded, dtype=precision, gpu_memory_utilization=gpu_memory)


def require_backend(name: str) -> None:
    """Refuse, in one sentence, a backend this machine cannot run (checked when a peer starts, not when its first
    policy arrives minutes later); imports nothing heavy."""
    if name == "torch":
        return
    if name != "vllm":
        raise InferenceError(f"unknown generation backend {name!r}: choose torch or vllm")
    try:
        found = importlib.util.find_spec("vllm") is not None
    except (ImportError, ValueError):  # a broken or blocked installation counts as none
        found = False
    if not found:
        raise InferenceError("the vLLM backend needs the gpu extra (./install.sh --gpu)")


def resolve_device(name: str) -> torch.device:
    """auto: the first CUDA GPU when torch sees one, else the CPU; cuda is refused when torch sees none."""
    if name not in ("auto", "cpu", "cuda"):
        raise InferenceError(f"unknown device {name!r}: choose auto, cpu or cuda")
    if name == "cuda" and not torch.cuda.is_available():
        raise InferenceError("device cuda was asked for, but torch sees no CUDA GPU on this machine")
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)
