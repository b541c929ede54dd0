"""In-place weight swap from a policy directory's safetensors files.

Why in place: rebuilding a model (and its tokenizer) per policy version costs seconds and churns memory; the
architecture never changes within a run, so the parameters are overwritten with `copy_` and everything holding
the module (hooks, caches of the backend) stays valid.
"""

from __future__ import annotations

from collections.abc import Collection
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import load_file

from inference.errors import InferenceError


def safetensors_files(directory: str | Path) -> list[Path]:
    files = sorted(Path(directory).glob("*.safetensors"))
    if not files:
        raise InferenceError(f"policy directory {directory} holds no .safetensors files")
    return files


def load_weights_in_place(model, directory: str | Path, only: Collection[str] | None = None) -> int:
    """Copy the tensors of the directory's safetensors files into `model`; returns how many were copied.

    only: the names of the tensors to copy, when the model already holds the rest (the tensors a new version
    changed, by their signed hashes); None copies all, and then every parameter must be covered (tied weights
    count once). Every tensor copied must name a parameter of the same shape, otherwise nothing is half-applied:
    all checks run before the first copy.
    """
    targets = dict(model.state_dict(keep_vars=True))
    incoming: dict[str, torch.Tensor] = {}
    for path in safetensors_files(directory):
        try:
            if only is None:
                incoming.update(load_file(str(path)))
                continue
            with safe_open(str(path), framework="pt") as fh:
                incoming.update({name: fh.get_tensor(name) for name in fh.keys() if name in only})
        except Exception as exc:  # noqa: BLE001 - a truncated or corrupt file
            raise InferenceError(f"policy file {path} is not readable safetensors ({type(exc).__name__})") from None
    for name, tensor in incoming.items():
        if name not in targets:
            raise InferenceError(f"policy tensor {name!r} in {directory} is not a parameter of this model")
        if tuple(tensor.shape) != tuple(targets[name].shape):
            raise InferenceError(f"policy tensor {name!r} has shape {tuple(tensor.shape)}, the model expects "
                                 f"{tuple(targets[name].shape)}")
    covered = {id(targets[n]) for n in incoming}
    missing = [n for n, p in model.named_parameters() if id(p) not in covered] if only is None else []
    if missing:
        raise InferenceError(f"policy directory {directory} lacks parameter {missing[0]!r}")
    with torch.no_grad():
        for name, tensor in incoming.items():
            targets[name].copy_(tensor.to(targets[name].dtype))
    return len(incoming)
