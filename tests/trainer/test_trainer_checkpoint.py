"""Checkpoints are all-or-nothing: a crash while writing leaves the previous checkpoint as the newest."""

import pytest
import torch

from trainer import checkpoint as ckpt
from trainer.checkpoint import TrainerState, latest_checkpoint, list_checkpoints, load_checkpoint, save_checkpoint


class _Tiny(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(3, 2)


def _rewrite_state(path, meta):
    """Write state.json as an older version would have, re-hashed so the manifest check lets it through."""
    import json

    (path / "state.json").write_text(json.dumps(meta))
    ckpt.write_manifest(path)


def _parts():
    model = _Tiny()
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    return model, opt, sched


def test_crash_mid_write_keeps_the_previous_checkpoint(tmp_path, monkeypatch):
    model, opt, sched = _parts()
    save_checkpoint(tmp_path, model, opt, sched, TrainerState(step=1, version=1, consumed={"ab": 1}))
    saved = model.lin.weight.detach().clone()
    with torch.no_grad():
        model.lin.weight.add_(1.0)

    def explode(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(ckpt.torch, "save", explode)
    with pytest.raises(OSError):
        save_checkpoint(tmp_path, model, opt, sched, TrainerState(step=2, version=1))
    assert [p.name for p in list_checkpoints(tmp_path)] == ["step-000001"]
    assert not any(p.name.startswith(".tmp") for p in tmp_path.iterdir())
    monkeypatch.undo()
    fresh, opt2, sched2 = _parts()
    state = load_checkpoint(latest_checkpoint(tmp_path), fresh, opt2, sched2)
    assert state.step == 1 and state.consumed == {"ab": 1}
    assert torch.equal(fresh.lin.weight, saved) and not torch.equal(saved, model.lin.weight)


def test_rng_states_round_trip(tmp_path):
    import random

    import numpy as np

    model, opt, sched = _parts()
    save_checkpoint(tmp_path, model, opt, sched, TrainerState(step=3))
    expected = (torch.rand(2), random.random(), np.random.rand())
    load_checkpoint(latest_checkpoint(tmp_path), model, opt, sched)
    assert torch.equal(torch.rand(2), expected[0])
    assert random.random() == expected[1] and np.random.rand() == expected[2]


def test_a_checkpoint_that_names_trained_groups_by_their_bytes_is_refused_rather_than_training_a_slot_twice(
        tmp_path):
    import json

    import pytest

    from trainer.errors import TrainerError

    model, opt, sched = _parts()
    path = save_checkpoint(tmp_path, model, opt, sched, TrainerState(step=3, version=2, consumed={"ab": 2, "cd": 1}))
    meta = json.loads((path / "state.json").read_text())
    assert meta["trained_slots"] == [["ab", 2], ["cd", 1]] and "consumed" not in meta
    del meta["trained_slots"]
    for by_bytes in ([["ab", 2], ["cd", 1]], ["ab", "cd"]):  # rollout ids with versions, or bare
        _rewrite_state(path, {**meta, "consumed": by_bytes})
        with pytest.raises(TrainerError, match="by their bytes, not by their slots, so resuming it could train a "
                                               "slot twice") as caught:
            load_checkpoint(path, *_parts())
        assert "\n" not in str(caught.value)
    _rewrite_state(path, {**meta, "consumed": []})  # trained on nothing: nothing to repeat
    assert load_checkpoint(path, *_parts()).consumed == {}
    for broken in ({"ab": 2}, [["ab"]], [["ab", "2"]], [[1, 2]]):
        _rewrite_state(path, {**meta, "trained_slots": broken})
        with pytest.raises(TrainerError, match="unknown form"):
            load_checkpoint(path, *_parts())
