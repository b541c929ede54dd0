"""Full trainer checkpoints (restart loses nothing) and published policy versions (what the swarm loads).

Why write-then-rename: a crash while writing must never leave a directory that looks complete. Everything is
written into a hidden temporary directory beside the target, flushed, then renamed in one atomic step; a reader
only ever sees whole checkpoints (`step-000012`) and whole policy versions (`v000003`).

Why a manifest: a file cut short by a full disk or a copy that stopped halfway reads as a whole checkpoint to
`ls`. Each checkpoint's manifest.json names the BLAKE3 hash of every other file in it, written before the rename
and checked before a load, so a damaged checkpoint is refused by name (trainer.checkpoint_resume then falls back to
the one before it) instead of failing deep inside a deserialiser.

A checkpoint holds the model (safetensors), optimizer and LR-scheduler state, the RNG states of torch, python and
numpy, the slots trained on, the step and the policy version; the curriculum position is a pure function of
the step (trainer.curriculum), stored alongside only to detect a schedule changed between runs.
"""

from __future__ import annotations

import json
import logging
import os
import random
import shutil
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import blake3
import numpy as np
import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_model as load_safetensors_model
from safetensors.torch import save_file
from safetensors.torch import save_model as save_safetensors_model

from trainer.errors import TrainerError

log = logging.getLogger(__name__)

CHECKPOINT_PREFIX = "step-"
POLICY_PREFIX = "v"
KEEP_CHECKPOINTS = 2
MANIFEST = "manifest.json"
_HASH_CHUNK = 1 << 20


@dataclass
class TrainerState:
    """The mutable counters that must survive a restart, beside model/optimizer/scheduler."""

    step: int = 0  # optimizer steps taken
    version: int = 0  # last published policy version (0 = the initial policy)
    consumed: dict[str, int] = field(default_factory=dict)
    """Hex slot key (verify.rollout.Slot) -> version of every slot trained on: a slot is trained once, across
    restarts too, since this travels with the checkpoint. Bounded by the async window: a group of a version older
    than `version - async_level` is refused as too stale before its slot is looked at, so TrainingRun.step drops
    the slots of those versions: this holds only the slots of the async_level + 1 newest versions, whatever the
    length of the run."""
    stage_index: int = 0  # curriculum stage at `step`, checked against the schedule on resume
    extra: dict = field(default_factory=dict)  # free-form JSON-able counters (e.g. tokens seen)


def rng_state() -> dict:
    """torch, python and numpy RNG states in a form torch.load(weights_only=True) accepts."""
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    return {
        "torch": torch.get_rng_state(),
        "python": random.getstate(),
        "numpy": (kind, torch.from_numpy(np.asarray(keys, dtype=np.int64)), int(pos), int(has_gauss), float(cached)),
    }


def set_rng_state(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    kind, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((kind, keys.numpy().astype(np.uint32), pos, has_gauss, cached))


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _commit_dir(tmp: Path, final: Path) -> None:
    """Atomically move a fully written temporary directory to its final name (replacing an older one)."""
    for f in tmp.iterdir():
        with open(f, "rb+") as handle:
            os.fsync(handle.fileno())
    if final.exists():
        trash = final.with_name(f".old-{final.name}-{uuid.uuid4().hex[:8]}")
        os.rename(final, trash)
        os.rename(tmp, final)
        shutil.rmtree(trash, ignore_errors=True)
    else:
        os.rename(tmp, final)
    _fsync_dir(final.parent)


def _tmp_beside(final: Path) -> Path:
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = final.with_name(f".tmp-{final.name}-{uuid.uuid4().hex[:8]}")
    tmp.mkdir()
    return tmp


def file_hash(path: Path) -> str:
    """BLAKE3 of a file's bytes, read in chunks so a multi-gigabyte model never sits in memory twice."""
    hasher = blake3.blake3()
    with open(path, "rb") as handle:
        while chunk := handle.read(_HASH_CHUNK):
            hasher.update(chunk)
    return hasher.hexdigest()


def write_manifest(directory: Path) -> None:
    """Name the hash of every file in `directory` (before it is renamed into place)."""
    files = {f.name: file_hash(f) for f in sorted(directory.iterdir()) if f.is_file() and f.name != MANIFEST}
    (directory / MANIFEST).write_text(json.dumps({"blake3": files}, indent=1, sort_keys=True))


def verify_checkpoint(path: Path) -> None:
    """Raise TrainerError naming the first file of checkpoint `path` that is missing or whose bytes are not the
    ones its manifest names."""
    path = Path(path)
    try:
        listed = json.loads((path / MANIFEST).read_text())["blake3"]
    except (OSError, ValueError, KeyError, TypeError):
        raise TrainerError(f"{path / MANIFEST} is missing or unreadable") from None
    for name, expected in sorted(listed.items()):
        try:
            actual = file_hash(path / name)
        except OSError:
            raise TrainerError(f"{path / name} is missing") from None
        if actual != expected:
            raise TrainerError(f"{path / name} does not match its hash in {MANIFEST} (cut short or damaged)")
        log.debug("verified %s (blake3 %s)", path / name, actual)


def prune_checkpoints(root: Path, keep_last: int) -> None:
    """Delete all but the newest `keep_last` checkpoints under `root`."""
    for old in list_checkpoints(root)[:-keep_last]:
        shutil.rmtree(old, ignore_errors=True)


def save_checkpoint(root: Path, model, optimizer, scheduler, state: TrainerState) -> Path:
    """Write checkpoint `root/step-NNNNNN` atomically, its manifest last (the caller prunes old ones)."""
    started = time.perf_counter()
    final = Path(root) / f"{CHECKPOINT_PREFIX}{state.step:06d}"
    tmp = _tmp_beside(final)
    try:
        save_safetensors_model(model, str(tmp / "model.safetensors"))
        torch.save({"optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(), "rng": rng_state()},
                   tmp / "trainer_state.pt")
        meta = {"step": state.step, "version": state.version, "stage_index": state.stage_index,
                "trained_slots": sorted([key, v] for key, v in state.consumed.items()), "extra": state.extra}
        (tmp / "state.json").write_text(json.dumps(meta))
        write_manifest(tmp)
        _commit_dir(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    log.info("checkpoint %s written in %.1f s", final, time.perf_counter() - started)
    return final


def list_checkpoints(root: Path) -> list[Path]:
    """Complete checkpoints under root, oldest first (temporary directories are never listed)."""
    root = Path(root)
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir() if p.is_dir() and p.name.startswith(CHECKPOINT_PREFIX)]
    return sorted(found, key=lambda p: p.name)


def load_checkpoint(path: Path, model, optimizer, scheduler) -> TrainerState:
    """Check the manifest's hashes, then restore model, optimizer, scheduler and RNG states in place; return the
    counters."""
    path = Path(path)
    verify_checkpoint(path)
    try:
        meta = json.loads((path / "state.json").read_text())
        blobs = torch.load(path / "trainer_state.pt", weights_only=True)
        load_safetensors_model(model, str(path / "model.safetensors"))
    except (OSError, ValueError, RuntimeError, KeyError, SafetensorError) as exc:
        raise TrainerError(f"checkpoint {path} cannot be loaded ({type(exc).__name__}: {str(exc)[:120]})") from None
    optimizer.load_state_dict(blobs["optimizer"])
    scheduler.load_state_dict(blobs["scheduler"])
    set_rng_state(blobs["rng"])
    consumed = _trained_slots(meta, path)
    return TrainerState(step=meta["step"], version=meta["version"], consumed=consumed,
                        stage_index=meta["stage_index"], extra=meta.get("extra", {}))


def _trained_slots(meta: dict, path: Path) -> dict[str, int]:
    """The slots a checkpoint trained on, as [hex slot key, version] pairs under "trained_slots".

    A checkpoint that lists "consumed" instead names the groups it trained on by their rollout ids (the hash of
    their bytes), from which no slot can be recovered: resuming it as if those were slots would let another group of
    a slot already trained on through, so it is refused, unless it lists none (then nothing can be trained twice)."""
    if "trained_slots" not in meta:
        if meta.get("consumed"):
            raise TrainerError(f"checkpoint {path} names the groups it trained on by their bytes, not by their slots, "
                               "so resuming it could train a slot twice; start the run afresh in a new output "
                               "directory, or resume from a checkpoint that lists trained_slots")
        return {}
    raw = meta["trained_slots"]
    if not (isinstance(raw, list) and all(isinstance(item, list) and len(item) == 2 and isinstance(item[0], str)
                                          and type(item[1]) is int for item in raw)):
        raise TrainerError(f"checkpoint {path} lists its trained slots in an unknown form; it cannot be resumed")
    return {key: version for key, version in raw}


def latest_checkpoint(root: Path) -> Path | None:
    found = list_checkpoints(root)
    return found[-1] if found else None


class WholeWeights:
    """How a run whose processes each hold the whole model publishes and checkpoints it (one process, or plain
    all-reduce data parallelism, where rank 0 writes). trainer.fsdp.ShardedWeights does the same for a sharded
    model, so TrainingRun needs no branch."""

    def publishable(self, model) -> tuple[object, dict | None]:
        """(module to write or evaluate, a copy of its weights already made or None): the live model itself."""
        return model, None

    def save(self, root: Path, model, optimizer, scheduler, state: TrainerState, *, write: bool) -> Path | None:
        """Write a checkpoint when `write` (rank 0); every rank calls it."""
        return save_checkpoint(root, model, optimizer, scheduler, state) if write else None

    def load(self, path: Path, model, optimizer, scheduler) -> TrainerState:
        return load_checkpoint(path, model, optimizer, scheduler)


def policy_dir(root: Path, version: int) -> Path:
    return Path(root) / f"{POLICY_PREFIX}{version:06d}"


def publish_policy(target: Path, model, tokenizer, description: dict, generation: dict,
                   dtype: str = "float32") -> Path:
    """Write a loadable policy version directory atomically at `target`.

    Contents: model.safetensors (+ shards when big) and config.json via save_pretrained, the tokenizer files,
    model.json (the model description: architecture config and tokenizer id, enough to rebuild it without a hub)
    and generation.json (group_size, temperature, max_new_tokens, stage: what workers must generate with).
    """
    target = Path(target)
    tmp = _tmp_beside(target)
    try:
        model.save_pretrained(str(tmp), safe_serialization=True)
        if dtype == "bfloat16":
            for path in sorted(tmp.glob("*.safetensors")):
                _round_to_bf16(path)
        if tokenizer is not None:
            tokenizer.save_pretrained(str(tmp))
        (tmp / "model.json").write_text(json.dumps(description, indent=1, sort_keys=True, default=str))
        (tmp / "generation.json").write_text(json.dumps(generation, indent=1, sort_keys=True))
        _commit_dir(tmp, target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return target


def _round_to_bf16(path: Path) -> None:
    """Rewrite a safetensors file with its floating-point tensors in bf16 (same names, same metadata)."""
    with safe_open(str(path), framework="pt") as fh:
        metadata = fh.metadata()
        tensors = {name: fh.get_tensor(name) for name in fh.keys()}
    rounded = {name: t.to(torch.bfloat16) if t.is_floating_point() else t for name, t in tensors.items()}
    save_file(rounded, str(path), metadata=metadata)


def read_generation(path: Path) -> dict:
    """The generation settings of a published policy directory."""
    try:
        return json.loads((Path(path) / "generation.json").read_text())
    except (OSError, ValueError) as exc:
        raise TrainerError(f"{path} is not a published policy (generation.json: {type(exc).__name__})") from None
