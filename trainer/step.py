"""One GRPO optimizer step on a batch of rollout groups: old logprobs, loss, accumulation, clip, skip on NaN.

Why a class around the pure functions of trainer.grpo: the step owns state that must move together and be
checkpointed together (model, AdamW, warm-up schedule, the snapshots of recently published versions used as the
importance-sampling "old" policy). Data parallelism enters through a narrow `Collective` (sum a number, sum
gradients), so the same code runs single-process (`LocalCollective`) and under torch.distributed.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from trainer.config import TrainerConfig
from trainer.errors import TrainerError
from trainer.grpo import (
    LossStats,
    batch_advantages,
    clip_gradients,
    constant_normaliser,
    grpo_loss,
    keep_informative_groups,
    length_penalised_reward,
    token_logprobs,
)
from trainer.step_record import StepReport
from verify.model_inputs import cache_keyword, left_padded


@dataclass(frozen=True)
class TrainGroup:
    """One accepted rollout group reduced to what the loss needs."""

    rollout_id: str  # hex BLAKE3 id of the rollout group's bytes (a label: the trainer dedups on slots)
    policy_version: int  # the version that generated every completion
    prompt_tokens: tuple[int, ...]
    completions: tuple[tuple[int, ...], ...]  # generated tokens of each completion, EOS included
    rewards: tuple[float, ...]  # one reward per completion, in [0, 1] before length shaping
    temperature: float  # its version's sampling temperature (the published settings', not the group's claim)
    max_new_tokens: int  # the generation limit in force: the constant of the loss normaliser
    logprobs: tuple[tuple[float, ...], ...] = ()  # the generator's sampling logprobs per token, when trusted


def step_temperature(groups: Sequence[TrainGroup]) -> float:
    """The one sampling temperature of a step's groups (1.0 for none). Why one: a micro-batch mixes groups of
    several workers and versions, and a temperature read from any one group would reach the others' rows; a run's
    versions share its configured temperature, so groups that disagree are a bug, refused rather than mixed."""
    temperatures = {g.temperature for g in groups}
    if len(temperatures) > 1:
        raise TrainerError(f"one step's groups carry temperatures {sorted(temperatures)}; a step trains at one")
    return temperatures.pop() if temperatures else 1.0


class LocalCollective:
    """Single-process stand-in for torch.distributed: the identity."""

    world_size = 1

    def all_sum(self, value: float) -> float:
        return value

    def all_max(self, value: float) -> float:
        return value

    def reduce_gradients(self, parameters: Sequence[torch.nn.Parameter]) -> None:
        return None


def shaped_rewards(group: TrainGroup, length_target: int, coef: float) -> list[float]:
    """Rewards after INTELLECT-2's length penalty (identity when no target)."""
    target = length_target or None
    return [length_penalised_reward(r, len(c), target, coef) for r, c in zip(group.rewards, group.completions)]


@dataclass(frozen=True)
class PackedRows:
    """A batch of completions with each distinct prompt stored once.

    prompts: the distinct prompts; row_prompt [B]: which prompt each row continues; tokens [B, T] right-padded
    completions; mask [B, T] (1 = real generated token).
    """

    prompts: tuple[tuple[int, ...], ...]
    row_prompt: torch.Tensor
    tokens: torch.Tensor
    mask: torch.Tensor
    pad_id: int

    def select(self, rows: torch.Tensor) -> "PackedRows":
        """These rows, cut to the longest of them: padding past it would be computed in full and thrown away."""
        mask = self.mask[rows]
        width = max(1, int(mask.sum(dim=1).max())) if len(mask) else 1
        return PackedRows(self.prompts, self.row_prompt[rows], self.tokens[rows, :width], mask[:, :width], self.pad_id)

    def lengths(self) -> list[int]:
        """Each row's completion length (its real tokens)."""
        return [int(n) for n in self.mask.sum(dim=1)]


def pack_rows(prompts: Sequence[Sequence[int]], completions: Sequence[Sequence[int]], pad_id: int) -> PackedRows:
    """Rows (prompt, completion) packed for completion_logits; equal prompts (a group's) are stored once."""
    index: dict[tuple[int, ...], int] = {}
    row_prompt = [index.setdefault(tuple(p), len(index)) for p in prompts]
    t_max = max(len(c) for c in completions)
    tokens = torch.full((len(completions), t_max), pad_id, dtype=torch.long)
    mask = torch.zeros((len(completions), t_max), dtype=torch.float32)
    for i, c in enumerate(completions):
        tokens[i, : len(c)] = torch.tensor(list(c), dtype=torch.long)
        mask[i, : len(c)] = 1.0
    return PackedRows(tuple(index), torch.tensor(row_prompt, dtype=torch.long), tokens, mask, pad_id)


def completion_logits(model, packed: PackedRows) -> torch.Tensor:
    """Logits [B, T, V] that predict each completion token, with every distinct prompt run once.

    Why: a GRPO group is G completions of one prompt, and prompts are often longer than the completions (the chat
    template alone is ~80 tokens on the tiny task); running each prompt once and attending to its cached keys and
    values from all G rows cuts the step's compute by up to G x (8x measured on tiny gcd: prompt 85 tokens,
    completions 6). Gradients flow through the shared cache into the prompt pass exactly as through G copies
    (autograd sums them), so the loss and its gradient are the unshared ones up to float rounding (test). Always
    two passes per call, prompt then completions, so FSDP ranks stay in lockstep whatever their rows.
    """
    from transformers.cache_utils import DynamicCache

    distinct, inverse = torch.unique(packed.row_prompt, return_inverse=True)
    ids, prompt_mask = left_padded([packed.prompts[i] for i in distinct.tolist()], packed.pad_id)
    device = next(model.parameters()).device
    rows_to_prompt = inverse.to(device)
    base = model.base_model
    cache = DynamicCache(config=model.config)
    cache_kw = cache_keyword(base)
    first = base(input_ids=ids.to(device), attention_mask=prompt_mask.to(device),
                 position_ids=(prompt_mask.cumsum(dim=1) - 1).clamp(min=0).to(device), use_cache=True,
                 **{cache_kw: cache}).last_hidden_state[:, -1:, :]  # [P, 1, H]: predicts completion token 0
    cache.batch_select_indices(rows_to_prompt)
    tokens = packed.tokens  # the last token's own output is unused, but a fixed shape keeps two passes per call
    attention = torch.cat([prompt_mask[inverse], torch.ones_like(tokens)], dim=1)
    positions = prompt_mask.sum(dim=1)[inverse].unsqueeze(1) + torch.arange(tokens.shape[1]).unsqueeze(0)
    rest = base(input_ids=tokens.to(device), attention_mask=attention.to(device), position_ids=positions.to(device),
                use_cache=True, **{cache_kw: cache}).last_hidden_state[:, :-1, :]  # [B, T - 1, H]
    hidden = torch.cat([first[rows_to_prompt], rest], dim=1)  # [B, T, H]
    return model.get_output_embeddings()(hidden)


class PolicyTrainer:
    """Holds model + AdamW + warm-up schedule + version snapshots and performs GRPO steps."""

    def __init__(self, model, cfg: TrainerConfig, *, pad_id: int, collective=None,
                 load_version: Callable[[int], dict | None] | None = None, reference: dict | None = None) -> None:
        self.model, self.cfg, self.pad_id = model, cfg, pad_id
        self.collective = collective or LocalCollective()
        self.optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr, betas=(cfg.beta1, cfg.beta2),
                                           weight_decay=cfg.weight_decay)
        warmup = max(1, cfg.warmup_steps)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, lambda s: min(1.0, (s + 1) / warmup))
        self.snapshots: dict[int, dict[str, torch.Tensor]] = {}
        self.current_version: int | None = None  # version whose weights equal the live model (no step since)
        self.load_version = load_version
        self._scratch = None
        self.reference = reference  # weights of the KL reference policy (used only when kl_coef > 0)
        self._reference_model = None

    # --- versions -------------------------------------------------------------------------------------------
    def mark_published(self, version: int, *, snapshot: bool = True, weights: dict | None = None) -> None:
        """Remember the live weights as `version`, keeping the async window's snapshots (k + 1 versions).

        snapshot=False skips the in-memory copy (its logprobs will come from the generator; a group without them
        falls back to the version's published files); `weights`: a copy of the live weights the caller already
        made (it is kept instead of a second copy)."""
        self.current_version = version
        if snapshot:
            live = weights if weights is not None else self.model.state_dict()
            self.snapshots[version] = {k: published_copy(v, self.cfg.publish_dtype) for k, v in live.items()}
        self._prune_snapshots()

    def _prune_snapshots(self) -> None:
        for old in sorted(self.snapshots)[: -(self.cfg.async_level + 1)]:
            del self.snapshots[old]

    def _weights_of(self, version: int) -> dict | None:
        if version in self.snapshots:
            return self.snapshots[version]
        return self.load_version(version) if self.load_version else None

    def _model_for(self, version: int):
        """(model, source) computing old logprobs for rollouts of `version` (see trainer.grpo's docstring): the
        weights as published, which the workers sampled with (bf16-rounded unless publish_dtype is float32)."""
        if version == self.current_version and self.cfg.publish_dtype == "float32":
            return self.model, "exact"
        weights = self._weights_of(version)
        if weights is None:
            return self.model, "current"
        if self._scratch is None:
            self._scratch = self._blank_copy()
        result = self._scratch.load_state_dict(weights, strict=False)
        if result.unexpected_keys or any(k not in self._tied_keys() for k in result.missing_keys):
            raise ValueError(f"weights of version {version} do not match the model: {result.missing_keys[:3]}")
        return self._scratch, "exact"

    def _blank_copy(self):
        """A second module of the same architecture (built from the config, not deep-copied: hooks that inference
        backends attach to the live model must not be cloned with it)."""
        clone = type(self.model)(self.model.config).to(next(self.model.parameters()).dtype)
        clone.requires_grad_(False)
        return clone.eval()

    def _tied_keys(self) -> set[str]:
        """Output-embedding keys that save_pretrained omits when they are tied to the input embeddings."""
        tied = getattr(self.model.config, "tie_word_embeddings", False)
        return {k for k in self.model.state_dict() if tied and k.startswith("lm_head.")}

    @torch.no_grad()
    def old_logprobs(self, groups: Sequence[TrainGroup], rows: list[tuple[int, int]]) -> tuple[torch.Tensor, str]:
        """Old-policy logprobs [B, T] for the (group, completion) rows, each from its generating version."""
        packed = self._pack(groups, rows)
        out = torch.zeros(packed.tokens.shape)
        sources = set()
        for version in sorted({groups[g].policy_version for g, _ in rows}):
            idx = [i for i, (g, _) in enumerate(rows) if groups[g].policy_version == version]
            model, source = self._model_for(version)
            sources.add(source)
            self._fill_logprobs(model, packed, idx, step_temperature(groups), out)
        return out, "+".join(sorted(sources))

    def generator_logprobs(self, groups: Sequence[TrainGroup], rows: list[tuple[int, int]]) -> torch.Tensor | None:
        """Old-policy logprobs [B, T] as the generating policy recorded them while sampling, or None.

        Why: they are exactly the behaviour policy's sampling logprobs (same definition as token_logprobs), so the
        no-grad forward of each generating version, and keeping its weights, are not needed; async training then
        costs no more per step than synchronous training. Only when cfg.old_logprobs is "generator" and every row
        carries one logprob per token (groups from an untrusted source carry none, see TrainingRun); not under
        FSDP, where every rank must run the same passes.
        """
        if self.cfg.old_logprobs != "generator" or not rows or getattr(self.collective, "lockstep", False):
            return None
        per_row = [groups[g].logprobs[c] if c < len(groups[g].logprobs) else None for g, c in rows]
        if any(lp is None or len(lp) != len(groups[g].completions[c]) for lp, (g, c) in zip(per_row, rows)):
            return None
        out = torch.zeros((len(rows), max(len(lp) for lp in per_row)))
        for i, lp in enumerate(per_row):
            out[i, : len(lp)] = torch.tensor(lp, dtype=torch.float32)
        return out

    @torch.no_grad()
    def reference_logprobs(self, groups: Sequence[TrainGroup], rows: list[tuple[int, int]]) -> torch.Tensor | None:
        """Logprobs [B, T] under the frozen reference policy (the initial weights), only when the KL term is on."""
        if self.cfg.kl_coef <= 0 or self.reference is None:
            return None
        if self._reference_model is None:
            self._reference_model = self._blank_copy()
            self._reference_model.load_state_dict(self.reference, strict=False)
            self._reference_model.requires_grad_(False)
        packed = self._pack(groups, rows)
        out = torch.zeros(packed.tokens.shape)
        self._fill_logprobs(self._reference_model, packed, list(range(len(rows))), step_temperature(groups), out)
        return out

    def _pack(self, groups, rows) -> PackedRows:
        return pack_rows([groups[g].prompt_tokens for g, _ in rows], [groups[g].completions[c] for g, c in rows],
                         self.pad_id)

    def _fill_logprobs(self, model, packed: PackedRows, idx: list[int], temperature: float, out: torch.Tensor) -> None:
        for chunk in self._micro_batches(packed, idx):
            sel = torch.tensor(chunk)
            part = packed.select(sel)
            logits = completion_logits(model, part)  # on the model's device; `out` stays on the CPU
            width = part.tokens.shape[1]
            out[sel, :width] = token_logprobs(logits, part.tokens.to(logits.device), temperature).to(out.device)

    def _micro_batches(self, packed: PackedRows, idx: list[int]) -> list[list[int]]:
        """`idx` in as many micro-batches as plain chunks of cfg.micro_batch (FSDP ranks count on that), each cut to
        its own longest row (`PackedRows.select`), so short completions stop paying for the longest one in the step.

        Order: a prompt's rows stay together, longest first, and prompts follow each other by their longest row.
        Sorting rows by length alone would scatter every group over every micro-batch, and each micro-batch runs
        each of its distinct prompts once: on SmolLM2 a 48-token prompt costs as much as a whole micro-batch of
        short completions.
        """
        lengths, prompt = packed.lengths(), packed.row_prompt.tolist()
        longest: dict[int, int] = {}
        for i in idx:
            longest[prompt[i]] = max(longest.get(prompt[i], 0), lengths[i])
        order = sorted(idx, key=lambda i: (-longest[prompt[i]], prompt[i], -lengths[i]))
        return _chunks(order, self.cfg.micro_batch)

    # --- the step -------------------------------------------------------------------------------------------
    def train_step(self, step: int, groups: Sequence[TrainGroup]) -> StepReport:
        started = time.perf_counter()
        rewards = [shaped_rewards(g, self.cfg.length_target, self.cfg.length_penalty) for g in groups]
        advantages = batch_advantages(rewards)
        keep = keep_informative_groups(advantages) if self.cfg.filter_zero_advantage else list(range(len(groups)))
        rows = [(g, c) for g in keep for c in range(len(groups[g].completions))]
        mean_reward = _mean([r for group in groups for r in group.rewards])
        n_rows = int(self.collective.all_sum(float(len(rows))))
        if n_rows == 0:
            return self._report(step, groups, keep, mean_reward, [], 0.0, "no informative group", "", started)
        max_tokens = max((groups[g].max_new_tokens for g in keep), default=1)
        normaliser = constant_normaliser(n_rows, int(self.collective.all_max(float(max_tokens))))
        lockstep = getattr(self.collective, "lockstep", False)  # FSDP: every rank runs every pass phase
        fused = self._on_policy(groups, rows)
        recorded = None if fused else self.generator_logprobs(groups, rows)
        if fused:
            old, source = None, "exact"
        elif recorded is not None:
            old, source = recorded, "generator"
        else:
            old, source = self.old_logprobs(groups, rows) if rows or lockstep else (torch.zeros(0, 0), "")
        ref = self.reference_logprobs(groups, rows) if rows else None
        self.optimizer.zero_grad(set_to_none=True)
        stats = self._accumulate(groups, rows, advantages, old, ref, normaliser) if rows or lockstep else []
        self.collective.reduce_gradients(list(self.model.parameters()))
        grad_norm = clip_gradients(self.model.parameters(), self.cfg.grad_clip)
        loss_sum = self.collective.all_sum(sum(s.loss for s in stats))
        skipped = ""
        if not math.isfinite(loss_sum) or not math.isfinite(grad_norm):
            skipped = "non-finite loss" if not math.isfinite(loss_sum) else "non-finite gradient"
            self.optimizer.zero_grad(set_to_none=True)
        else:
            self.optimizer.step()
            self.scheduler.step()
            self.current_version = None  # live weights no longer equal any published version
        return self._report(step, groups, keep, mean_reward, stats, grad_norm, skipped, source, started)

    def _on_policy(self, groups: Sequence[TrainGroup], rows: list[tuple[int, int]]) -> bool:
        """True when every row was generated by the live weights and a forward pass is deterministic (no dropout).

        Then the old-policy logprobs equal the detached logprobs of the training forward itself, and the separate
        no-grad pass (a quarter of the step's compute) is skipped: gradient accumulation never changes the weights
        between micro-batches of one step. This is the synchronous trainer's common case.
        """
        if not rows or self.current_version is None or getattr(self.collective, "lockstep", False):
            return False  # under FSDP every rank must run the same passes, whatever its own rows are
        if self.cfg.publish_dtype != "float32":  # the rows were sampled with the bf16-rounded weights, not these
            return False
        if any(groups[g].policy_version != self.current_version for g, _ in rows):
            return False
        return not any(isinstance(m, torch.nn.Dropout) and m.p > 0 for m in self.model.modules())

    def _accumulate(self, groups, rows, advantages, old, ref, normaliser) -> list[LossStats]:
        """Forward and backward every micro-batch; `old` None means on-policy (old logprobs from this forward)."""
        packed = self._pack(groups, rows)
        adv = torch.stack([advantages[g][c] for g, c in rows])  # [B]
        stats = []
        loss_cfg = self.cfg.loss_config()
        self.model.train()
        for chunk in self._micro_batches(packed, list(range(len(rows)))):
            sel = torch.tensor(chunk)
            part = packed.select(sel)
            logits = completion_logits(self.model, part)
            temperature = step_temperature(groups)
            tokens, mask = part.tokens.to(logits.device), part.mask.to(logits.device)
            width = tokens.shape[1]
            old_chunk = token_logprobs(logits.detach(), tokens, temperature) if old is None else old[sel, :width]
            loss, s = grpo_loss(logits, tokens, mask, old_chunk.to(logits.device), adv[sel].to(logits.device),
                                temperature=temperature, normaliser=normaliser,
                                cfg=loss_cfg, ref_logprobs=None if ref is None else ref[sel, :width].to(logits.device))
            loss.backward()
            stats.append(s)
        return stats

    def _report(self, step, groups, keep, reward, stats, grad_norm, skipped, source, started) -> StepReport:
        tokens = sum(s.tokens for s in stats)
        weight = max(tokens, 1)
        return StepReport(
            step=step, reward=reward, groups=len(groups), groups_trained=len(keep), tokens=tokens,
            loss=sum(s.loss for s in stats), entropy=sum(s.entropy * s.tokens for s in stats) / weight,
            kl=sum(s.kl * s.tokens for s in stats) / weight,
            clip_fraction=sum(s.clip_fraction * s.tokens for s in stats) / weight,
            grad_norm=grad_norm, lr=self.optimizer.param_groups[0]["lr"], skipped=skipped, old_logprobs=source,
            seconds=time.perf_counter() - started,
        )


def _chunks(items: list, size: int) -> list[list]:
    return [items[i : i + size] for i in range(0, len(items), size)]


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else 0.0


def published_copy(tensor: torch.Tensor, publish_dtype: str) -> torch.Tensor:
    """A detached copy of a weight as workers load it: rounded to bf16 when versions are published in bf16
    (kept in bf16, half the memory; a model loading it upcasts exactly)."""
    if publish_dtype == "bfloat16" and tensor.is_floating_point():
        return tensor.detach().to(torch.bfloat16)
    return tensor.detach().clone()
