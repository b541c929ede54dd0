"""Old logprobs of bf16-published versions under FSDP: the snapshot must be the rounded weights the workers
sampled with, and the live passes each rank counts (FsdpPolicyTrainer._live_passes, which sizes the lockstep's idle
passes) must be the live passes old_logprobs really runs, or ranks with uneven rows run unequal collectives."""

import pytest
import torch

from tests.trainer.test_trainer_step import _groups, _trainer
from trainer.fsdp_step import FsdpPolicyTrainer

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _as_fsdp(trainer) -> FsdpPolicyTrainer:
    """The FSDP trainer's methods over a plain trainer's state (no process group needed for what is tested)."""
    view = FsdpPolicyTrainer.__new__(FsdpPolicyTrainer)
    view.__dict__.update(trainer.__dict__)
    view._weights_memo = {}
    return view


def test_fsdp_snapshots_of_bf16_versions_are_the_rounded_weights(tiny):
    weights = {k: v.detach().clone() for k, v in tiny.model.state_dict().items()}
    fsdp = _as_fsdp(_trainer(tiny, weights, fused=False, publish_dtype="bfloat16"))
    gathered = {k: v.detach().clone() for k, v in tiny.model.state_dict().items()}  # what _publishable hands over
    fsdp.mark_published(1, weights=gathered)
    assert all(v.dtype == torch.bfloat16 for v in fsdp.snapshots[1].values() if v.is_floating_point())


def test_fsdp_counts_as_live_only_the_passes_old_logprobs_runs_on_the_live_model(tiny):
    weights = {k: v.detach().clone() for k, v in tiny.model.state_dict().items()}
    fsdp = _as_fsdp(_trainer(tiny, weights, fused=False, publish_dtype="bfloat16"))
    groups = _groups(0)
    rows = [(g, c) for g in range(len(groups)) for c in range(len(groups[g].completions))]
    counted = fsdp._live_passes(groups, rows)
    model, _ = fsdp._model_for(0)
    assert counted == (1 if model is fsdp.model else 0) * -(-len(rows) // fsdp.cfg.micro_batch), (
        "current-version rows are counted as live passes but run on the bf16 scratch model: a rank holding them "
        "skips the idle passes its peers run, and the FSDP collectives pair up wrongly")
