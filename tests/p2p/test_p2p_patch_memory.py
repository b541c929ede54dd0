"""Applying a patch holds about its largest tensor (p2p/pieces/patch.py's docstring: "memory stays at the largest
tensor plus the patch"); positions as int64 and several whole-tensor copies make it several times that."""

from __future__ import annotations

import tracemalloc

import blake3
import torch
from safetensors.torch import save_file

from p2p.pieces.patch import _read, apply_patch, encode_patch, tensor_index


def test_applying_a_patch_holds_about_one_tensor_besides_the_patch(tmp_path):
    n = 8 << 20  # one bf16 tensor of 16 MiB, 40 % of its elements changed (an embedding after a few steps)
    old = torch.randn(n, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
    new = old.clone()
    new.view(torch.int16)[torch.rand(n, generator=torch.Generator().manual_seed(1)) < 0.4] += 1
    save_file({"w": old}, str(tmp_path / "p.safetensors"))
    (tmp_path / "c").mkdir()
    save_file({"w": new}, str(tmp_path / "c" / "model.safetensors"))
    encode_patch([tmp_path / "p.safetensors"], [tmp_path / "c" / "model.safetensors"], tmp_path / "x.patch")
    path, spot = tensor_index([tmp_path / "c" / "model.safetensors"])["w"]
    expected = {"w": ("model.safetensors", spot, blake3.blake3(_read(path, spot)).digest())}
    patch = (tmp_path / "x.patch").read_bytes()
    (tmp_path / "out").mkdir()
    tracemalloc.start()
    try:
        apply_patch(patch, [tmp_path / "p.safetensors"], tmp_path / "out", expected)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak <= 3 * spot.nbytes, f"applying held {peak / spot.nbytes:.1f}x the tensor"
