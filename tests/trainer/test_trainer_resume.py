"""Resuming a run: a damaged newest checkpoint falls back to the one before it, another run's `out` is refused."""

import json

import pytest
import torch

from trainer.checkpoint import (
    MANIFEST,
    TrainerState,
    list_checkpoints,
    load_checkpoint,
    prune_checkpoints,
    save_checkpoint,
)
from trainer.checkpoint_resume import RUN_KEY, AnotherRun, resume, run_identity
from trainer.config import TrainerConfig
from trainer.errors import TrainerError


class _Tiny(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(3, 2)


def _parts():
    model = _Tiny()
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    return model, opt, torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)


def _run(tmp_path, cfg, steps=(5, 10)):
    model, opt, sched = _parts()
    for step in steps:
        save_checkpoint(tmp_path / "checkpoints", model, opt, sched,
                        TrainerState(step=step, extra={RUN_KEY: run_identity(cfg)}))
    return model


def _resume(cfg):
    said = []
    model, opt, sched = _parts()
    found = resume(cfg, lambda path: load_checkpoint(path, model, opt, sched), said.append)
    return found, said


def _truncate(path):
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def test_a_truncated_newest_model_falls_back_to_the_checkpoint_before_it_naming_the_file(tmp_path):
    cfg = TrainerConfig(out=tmp_path)
    _run(tmp_path, cfg)
    damaged = tmp_path / "checkpoints" / "step-000010" / "model.safetensors"
    _truncate(damaged)
    (path, state), said = _resume(cfg)
    assert state.step == 5 and path.name == "step-000005"
    assert said[0].startswith("skipped checkpoint") and str(damaged) in said[0] and "hash" in said[0]
    assert said[1] == f"resuming {tmp_path} from step 5 ({path})"


def test_a_checkpoint_without_its_manifest_is_skipped(tmp_path):
    cfg = TrainerConfig(out=tmp_path)
    _run(tmp_path, cfg)
    (tmp_path / "checkpoints" / "step-000010" / MANIFEST).unlink()
    (_, state), said = _resume(cfg)
    assert state.step == 5 and MANIFEST in said[0]


def test_no_checkpoint_that_verifies_is_one_error_not_a_fresh_start(tmp_path):
    cfg = TrainerConfig(out=tmp_path)
    _run(tmp_path, cfg)
    for path in list_checkpoints(tmp_path / "checkpoints"):
        _truncate(path / "trainer_state.pt")
    with pytest.raises(TrainerError, match="none of them verifies"):
        _resume(cfg)


def test_a_truncated_model_loaded_directly_is_a_trainer_error_naming_its_file(tmp_path):
    cfg = TrainerConfig(out=tmp_path)
    _run(tmp_path, cfg, steps=(3,))
    checkpoint = tmp_path / "checkpoints" / "step-000003"
    _truncate(checkpoint / "model.safetensors")
    with pytest.raises(TrainerError, match=str(checkpoint / "model.safetensors")):
        load_checkpoint(checkpoint, *_parts())


def test_an_out_of_another_task_is_refused_naming_the_difference(tmp_path):
    _run(tmp_path, TrainerConfig(out=tmp_path, task="gcd"))
    with pytest.raises(AnotherRun, match=r"holds another run: task 'gcd' \(now 'lcm'\).*--resume"):
        _resume(TrainerConfig(out=tmp_path, task="lcm"))


def test_resume_continues_another_run_when_asked(tmp_path):
    _run(tmp_path, TrainerConfig(out=tmp_path, task="gcd"))
    (_, state), _ = _resume(TrainerConfig(out=tmp_path, task="lcm", resume=True))
    assert state.step == 10


def test_settings_that_do_not_change_what_is_trained_may_differ(tmp_path):
    _run(tmp_path, TrainerConfig(out=tmp_path, steps=20))
    (_, state), _ = _resume(TrainerConfig(out=tmp_path, steps=40, threads=2, keep_last=5))
    assert state.step == 10


def test_resume_with_nothing_to_resume_is_refused_and_a_fresh_out_starts_afresh(tmp_path):
    with pytest.raises(TrainerError, match="holds no checkpoint"):
        _resume(TrainerConfig(out=tmp_path, resume=True))
    assert _resume(TrainerConfig(out=tmp_path)) == (None, [])


def test_resume_from_names_the_checkpoint_to_load(tmp_path):
    cfg = TrainerConfig(out=tmp_path)
    _run(tmp_path, cfg)
    older = tmp_path / "checkpoints" / "step-000005"
    (path, state), said = _resume(TrainerConfig(out=tmp_path, resume_from=str(older)))
    assert (path, state.step) == (older, 5) and said == [f"resuming {tmp_path} from step 5 ({older})"]
    with pytest.raises(TrainerError, match="not a checkpoint directory"):
        _resume(TrainerConfig(out=tmp_path, resume_from=str(tmp_path / "nowhere")))


def test_keep_last_bounds_the_checkpoints_kept(tmp_path):
    _run(tmp_path, TrainerConfig(out=tmp_path), steps=(1, 2, 3, 4))
    prune_checkpoints(tmp_path / "checkpoints", 3)
    assert [p.name for p in list_checkpoints(tmp_path / "checkpoints")] == [
        "step-000002", "step-000003", "step-000004"]


def test_the_manifest_names_every_file_of_the_checkpoint(tmp_path):
    _run(tmp_path, TrainerConfig(out=tmp_path), steps=(1,))
    checkpoint = tmp_path / "checkpoints" / "step-000001"
    listed = json.loads((checkpoint / MANIFEST).read_text())["blake3"]
    assert set(listed) == {p.name for p in checkpoint.iterdir()} - {MANIFEST}
