"""Policy versions in bf16 written to disk for the patch tests: a parent, a child with a few changed elements,
their patch and signed manifests."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file

from p2p.identity import Identity
from p2p.pieces.manifest import GenerationSettings, PatchRef, PolicyManifest, build_manifest, sign_manifest
from p2p.pieces.patch import encode_patch

PIECE = 262144


def weights(seed: int, rows: int = 512) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return {"embed": torch.randn(rows, 256, generator=gen).to(torch.bfloat16),
            "norm": torch.ones(256, dtype=torch.bfloat16),
            "head.bias": torch.randn(64, generator=gen)}


def nudged(parent: dict[str, torch.Tensor], share: float = 0.03, seed: int = 1) -> dict[str, torch.Tensor]:
    """`parent` with about `share` of the embedding's elements moved by one bf16 step; the rest unchanged."""
    gen = torch.Generator().manual_seed(seed)
    child = {k: v.clone() for k, v in parent.items()}
    flat = child["embed"].view(torch.int16).view(-1)
    picked = torch.rand(flat.numel(), generator=gen) < share
    flat[picked] += 1
    return child


def write_version(directory: Path, tensors: dict[str, torch.Tensor]) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(directory / "model.safetensors"))
    (directory / "model.json").write_text(json.dumps({"architecture": "test"}))
    return directory


def manifest_of(directory: Path, version: int, patch: PatchRef | None = None) -> PolicyManifest:
    return build_manifest(directory, run="r", version=version, parent_version=version - 1 if version else None,
                          created_at=0.0, generation=GenerationSettings(2, 1.0, 8, 0), piece_size=PIECE, patch=patch)


def signed(manifest: PolicyManifest, key: Identity) -> bytes:
    return sign_manifest(manifest, key.sign, key.public_bytes).to_bytes()


def parent_and_child(root: Path, child: dict[str, torch.Tensor] | None = None
                     ) -> tuple[PolicyManifest, PolicyManifest, Path, Path]:
    """(parent manifest, child manifest with its patch, parent dir, child dir)."""
    parent_tensors = weights(0)
    old = write_version(root / "v1", parent_tensors)
    new = write_version(root / "v2", child if child is not None else nudged(parent_tensors))
    parent = manifest_of(old, 1)
    encode_patch([old / "model.safetensors"], [new / "model.safetensors"], new / "model.patch")
    return parent, manifest_of(new, 2, PatchRef(parent.id, 1, "model.patch")), old, new
