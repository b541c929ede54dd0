"""A local rollout source: the swarm's inference role in-process, for `swarm train` and tests.

Why it mirrors a swarm worker step for step: it follows the newest published policy directory (hot-swapping its
weights from the files, never sharing tensors with the trainer), draws its prompts with the same seeded
assignment (tasks.assignment) from the curriculum segment named in that policy's generation.json, samples with the
seeded Gumbel-max keys and scores with verify.rewards. So what the local loop learns from is exactly what the
quorum-accepted stream would deliver, minus the network and the votes.
"""

from __future__ import annotations

from dataclasses import replace

import blake3

from inference.backend import GenerationRequest
from inference.models import load_model
from inference.torch_backend import TorchBackend
from tasks import decode_completion, render_prompt_tokens, segment
from tasks.assignment import assign_tasks
from trainer.grpo import length_instruction
from verify.rewards import compute_rewards
from verify.rollout import Completion, RolloutGroup
from verify.sampling import SamplingKey


def local_manifest_id(version: int, run: str) -> bytes:
    """Stand-in manifest id for a locally published version (the swarm uses the signed manifest's BLAKE3)."""
    return blake3.blake3(f"local-manifest\x00{run}\x00{version}".encode()).digest()


class LocalRolloutSource:
    """Generates one batch of rollout groups per call with the given published policy."""

    def __init__(self, loaded, train_set, *, run: str, prompts_per_step: int, worker: str = "local",
                 length_target: int = 0, capture_proofs: bool = False, batch_rows: int = 128) -> None:
        self.loaded, self.train_set, self.run, self.worker = loaded, train_set, run, worker
        self.prompts_per_step, self.length_target = prompts_per_step, length_target
        self.backend = TorchBackend(loaded, capture_proofs=capture_proofs, max_batch_rows=batch_rows)
        self._segments = {name: segment(train_set, name) or train_set.indices() for name in ("short", "all", "long")}
        self._prompts: dict[int, tuple[int, ...]] = {}

    @classmethod
    def for_config(cls, cfg, train_set) -> "LocalRolloutSource":
        """The source `swarm train` generates with, in-process or in its generator process: a fresh copy of
        cfg.model (its weights follow the published policies), the run's name, the step's prompt count and how many
        completions it decodes together."""
        return cls.from_loaded(cfg, load_model(cfg.model), train_set)

    @classmethod
    def from_loaded(cls, cfg, loaded, train_set) -> "LocalRolloutSource":
        """for_config with a model already loaded (a forked generator's copy of the trainer's initial model)."""
        return cls(loaded, train_set, run=cfg.run, prompts_per_step=cfg.prompts_per_step,
                   length_target=cfg.length_target, batch_rows=cfg.generation_batch_rows)

    def prompt_tokens(self, index: int) -> tuple[int, ...]:
        if index not in self._prompts:
            entry = self.train_set[index]
            if self.length_target:
                entry = replace(entry, prompt=f"{entry.prompt.rstrip()} {length_instruction(self.length_target)}")
            self._prompts[index] = tuple(render_prompt_tokens(self.loaded.tokenizer, entry))
        return self._prompts[index]

    def _follow(self, policy) -> None:
        if self.backend.policy_version != policy.version:
            self.backend.load_policy(str(policy.path), version=policy.version,
                                     manifest_id=local_manifest_id(policy.version, self.run))

    def generate(self, step: int, policy) -> list[RolloutGroup]:
        self._follow(policy)
        gen = policy.generation
        indices = assign_tasks(self.run, self.worker, step, self._segments[gen["data"]], self.prompts_per_step)
        requests = [
            GenerationRequest(self.prompt_tokens(i),
                              tuple(SamplingKey(self.run, self.worker, step, i, s) for s in range(gen["group_size"])),
                              float(gen["temperature"]), int(gen["max_new_tokens"]))
            for i in indices
        ]
        results = self.backend.generate(requests)
        return [self._group(step, index, request, result)
                for index, request, result in zip(indices, requests, results)]

    def _group(self, step: int, index: int, request, result) -> RolloutGroup:
        entry = self.train_set[index]
        completions = tuple(
            Completion(c.tokens, c.logprobs, c.finish_reason, reward, c.proof)
            for c, reward in zip(result.completions, self.rewards(entry, [c.tokens for c in result.completions]))
        )
        return RolloutGroup(self.run, result.policy_version, result.manifest_id, self.worker, step, entry.dataset,
                            index, request.prompt_tokens, request.temperature, request.max_new_tokens, completions)

    def rewards(self, entry, completions) -> list[float]:
        """The group's rewards, one scorer round trip for all its completions."""
        texts = [decode_completion(self.loaded.tokenizer, tokens) for tokens in completions]
        return compute_rewards(entry.reward_fn, texts, entry.to_dict())
