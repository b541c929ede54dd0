"""The GRPO step over a sharded (FSDP) model: the same step as trainer.step, with every live pass in lockstep.

Why a subclass: under plain all-reduce each rank may run any number of forward/backward passes on its share of the
batch and meet the others once, at the gradient all-reduce. Under FSDP every forward of the live model all-gathers
weights and every backward reduce-scatters gradients, so all ranks must run the SAME number of passes in the same
order, or the collectives pair up wrongly and hang. Before each phase (old-policy logprobs, then loss passes) the
ranks agree on the largest pass count with one all_max, and a rank with fewer micro-batches runs idle passes on a
one-token input whose loss is multiplied by zero: they add nothing to any gradient. Version snapshots gather the
full weights (the scratch model that recomputes old logprobs is a plain, unsharded module).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from trainer.collectives import FsdpCollective
from trainer.errors import TrainerError
from trainer.fsdp import full_state_dict, is_sharded
from trainer.step import PolicyTrainer, TrainGroup, _chunks, completion_logits, pack_rows, published_copy


class FsdpPolicyTrainer(PolicyTrainer):
    """PolicyTrainer for a model sharded by trainer.fsdp.apply_fsdp (build it after sharding)."""

    def __init__(self, model, cfg, *, pad_id: int, collective: FsdpCollective, **kwargs) -> None:
        if not is_sharded(model) or not isinstance(collective, FsdpCollective):
            raise TrainerError("the FSDP trainer needs a model sharded by apply_fsdp and an FsdpCollective")
        super().__init__(model, cfg, pad_id=pad_id, collective=collective, **kwargs)
        self._weights_memo: dict[int, dict | None] = {}

    def mark_published(self, version: int, *, snapshot: bool = True, weights: dict | None = None) -> None:
        """Snapshot the gathered full weights (a collective unless `weights` already holds them: every rank
        publishes every version). Always, whatever `snapshot` says: FSDP recomputes old logprobs on every rank
        (generator logprobs are not used in lockstep)."""
        super().mark_published(version, snapshot=False)
        live = weights if weights is not None else full_state_dict(self.model)
        self.snapshots[version] = {k: published_copy(v, self.cfg.publish_dtype) for k, v in live.items()}
        self._prune_snapshots()

    def _weights_of(self, version: int) -> dict | None:
        """Memoised within one old_logprobs call: planning the passes and running them read the same versions."""
        if version not in self._weights_memo:
            self._weights_memo[version] = super()._weights_of(version)
        return self._weights_memo[version]

    def _live_passes(self, groups: Sequence[TrainGroup], rows: list[tuple[int, int]]) -> int:
        """Forward passes old_logprobs will run on the live model (as PolicyTrainer._model_for picks it)."""
        passes = 0
        for version in {groups[g].policy_version for g, _ in rows}:
            live = version == self.current_version and self.cfg.publish_dtype == "float32"
            if live or self._weights_of(version) is None:
                count = sum(1 for g, _ in rows if groups[g].policy_version == version)
                passes += len(_chunks(list(range(count)), self.cfg.micro_batch))
        return passes

    @torch.no_grad()
    def old_logprobs(self, groups: Sequence[TrainGroup], rows: list[tuple[int, int]]) -> tuple[torch.Tensor, str]:
        try:
            mine = self._live_passes(groups, rows)
            total = int(self.collective.all_max(float(mine)))
            result = super().old_logprobs(groups, rows) if rows else (torch.zeros(0, 0), "")
            self._idle_passes(total - mine, backward=False)
            return result
        finally:
            self._weights_memo = {}

    def _accumulate(self, groups, rows, advantages, old, ref, normaliser):
        mine = len(_chunks(list(range(len(rows))), self.cfg.micro_batch))
        total = int(self.collective.all_max(float(mine)))
        stats = super()._accumulate(groups, rows, advantages, old, ref, normaliser) if rows else []
        self._idle_passes(total - mine, backward=True)
        return stats

    def _idle_passes(self, count: int, *, backward: bool) -> None:
        """Passes that join the other ranks' collectives and contribute exactly zero to every gradient."""
        one_token = pack_rows([(self.pad_id,)], [(self.pad_id,)], self.pad_id)
        for _ in range(count):
            with torch.set_grad_enabled(backward):
                logits = completion_logits(self.model, one_token)  # [1, 1, V], the same two passes as a live call
                if backward:
                    (logits.float().sum() * 0.0).backward()
