"""Choosing a backend and a device by name: the names peers accept, and one clear sentence for what cannot run."""

from __future__ import annotations

import sys

import pytest
import torch

from inference.errors import InferenceError
from inference.select import open_backend, resolve_device
from inference.torch_backend import TorchBackend


def test_devices_resolve_to_what_the_machine_has(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert resolve_device("auto") == torch.device("cpu") and resolve_device("cpu") == torch.device("cpu")
    with pytest.raises(InferenceError, match="device cuda was asked for, but torch sees no CUDA GPU"):
        resolve_device("cuda")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert resolve_device("auto") == torch.device("cuda") == resolve_device("cuda")
    assert resolve_device("cpu") == torch.device("cpu")  # asked for, even where a GPU is present
    with pytest.raises(InferenceError, match="unknown device 'gpu0'"):
        resolve_device("gpu0")


def test_backends_by_name(tiny, monkeypatch):
    assert isinstance(open_backend("torch", tiny), TorchBackend)
    with pytest.raises(InferenceError, match="unknown generation backend 'tensorrt'"):
        open_backend("tensorrt", tiny)
    monkeypatch.setitem(sys.modules, "vllm", None)  # as on a machine without the gpu extra
    with pytest.raises(InferenceError, match="the vLLM backend needs the gpu extra"):
        open_backend("vllm", tiny)


def test_a_validator_asking_for_a_missing_gpu_is_refused_before_it_joins(monkeypatch):
    from swarm.config import load_config
    from swarm.roles.build import build_roles

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(InferenceError, match="device cuda was asked for") as caught:
        build_roles(load_config(None, {"roles": ("validator",), "device": "cuda"}))
    assert caught.value.user_facing  # the CLI prints it as one line, exit status 2
    with pytest.raises(InferenceError, match="device cuda was asked for"):
        build_roles(load_config(None, {"roles": ("trainer",), "device": "cuda"}))
    assert build_roles(load_config(None, {"roles": ("seed",), "device": "cuda"})) == []  # seeds compute nothing


def test_an_inference_peer_without_vllm_is_refused_before_it_joins(monkeypatch):
    from swarm.config import load_config
    from swarm.roles.build import build_roles

    monkeypatch.setitem(sys.modules, "vllm", None)  # as on a machine without the gpu extra
    with pytest.raises(InferenceError, match="the vLLM backend needs the gpu extra"):
        build_roles(load_config(None, {"roles": ("inference",), "backend": "vllm"}))
    assert len(build_roles(load_config(None, {"roles": ("inference",), "backend": "torch"}))) == 1
