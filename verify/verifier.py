"""The batched verifier: one padded prefill per batch of groups, then every check, one verdict per group.

Why this order: the cheap checks (schema, policy window and manifest, the run's generation settings, assignment,
prompt rendering, vocabulary, stop tokens) run first and a group failing them never costs a forward pass. The
surviving groups are sorted by length into batches bounded by `max_batch_tokens`; a batch prefills its prompts
once (left-padded) and then every completion over its prompt's cached keys and values (right-padded, in passes of
similar lengths), with a different batch composition and padding than the generator used; honest groups still
pass because TOPLOC and the sampling check tolerate kernel noise. The prefill input is prompt + completion[:-1]:
the outputs at positions P-1 .. P+T-2 are the logits that sampled each generated token and the last hidden states
the proof commits. The TOPLOC check of all groups is then one batched call.

The LM head runs only on those positions (the decoder's last hidden state, already after the final norm, is sliced
first), so a large vocabulary does not blow up memory.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import blake3
import torch

from verify.checks import (
    CheckConfig,
    CheckResult,
    RunContext,
    check_assignment,
    check_contract,
    check_lengths,
    check_logprobs,
    check_policy,
    check_proofs_many,
    check_rendering,
    check_rewards_many,
    check_sampling,
    check_stop_tokens,
    check_termination,
    recomputed_logprobs,
)
from verify.model_inputs import cache_keyword, left_padded, length_buckets
from verify.rollout import RolloutGroup, RolloutSchemaError
from verify.verdicts import Verdict


@dataclass
class _Pending:
    """A group that passed the cheap checks: its prefill's hidden states (one slot per completion) and the checks
    run on its logits right after its batch (the logits are then dropped: [T, V] each is the verifier's big memory)."""

    index: int
    group: RolloutGroup
    checks: list[CheckResult]
    hidden: list[torch.Tensor | None]
    logit_checks: list[CheckResult] = field(default_factory=list)


LOGITS_BUDGET_BYTES = 256 * 1024 * 1024
"""Most float32 logits one prefill batch may hold: batches are cut to fit (a 49k vocabulary allows ~1,300 tokens)."""


def verify_groups(
    models: Mapping[int, torch.nn.Module],
    groups: Sequence[RolloutGroup | dict | bytes],
    ctx: RunContext,
    config: CheckConfig | None = None,
    *,
    max_batch_tokens: int = 16384,
) -> list[Verdict]:
    """One Verdict per input, in order; never raises. `models` maps policy version -> HF causal LM (eval mode)."""
    config = config or CheckConfig()
    verdicts: list[Verdict | None] = [None] * len(groups)
    pending: list[_Pending] = []
    for i, raw in enumerate(groups):
        group, verdict = _parse(raw)
        if verdict is None:
            verdict, item = _cheap_checks(i, group, models, ctx)
            if item is not None:
                pending.append(item)
        verdicts[i] = verdict
    by_version: dict[int, list[_Pending]] = {}
    for item in pending:
        by_version.setdefault(item.group.policy_version, []).append(item)
    for version, items in by_version.items():
        model = models[version]
        vocab = getattr(getattr(model, "config", None), "vocab_size", None) or 1
        budget = max(1, LOGITS_BUDGET_BYTES // (4 * int(vocab)))
        for batch in _batches(items, min(max_batch_tokens, budget)):
            _verify_batch(model, batch, ctx, config)
    prefilled = [item for item in pending if all(c.ok for c in item.checks)]
    _reward_checks([item for item in prefilled if item.logit_checks], ctx, config)
    proofs = dict(zip((id(item) for item in prefilled), _proof_checks(prefilled, config)))
    for item in pending:
        checks = item.checks + item.logit_checks + ([proofs[id(item)]] if id(item) in proofs else [])
        verdicts[item.index] = Verdict(item.group.rollout_id(), all(c.ok for c in checks), tuple(checks))
    return [v for v in verdicts if v is not None]


def _verify_batch(model: torch.nn.Module, batch: list[_Pending], ctx: RunContext, config: CheckConfig) -> None:
    """Prefill one batch, then run every logit-based check of its groups; a failed prefill rejects this batch only."""
    try:
        logits = _prefill_batch(model, batch)
    except Exception as exc:  # noqa: BLE001 - a failed batch rejects its groups, never the validator
        for item in batch:
            item.checks.append(CheckResult("prefill", False, f"prefill failed ({type(exc).__name__})"))
        return
    for item, item_logits in zip(batch, logits):
        item.logit_checks = _logit_checks(item.group, item_logits, ctx, config)


def _parse(raw) -> tuple[RolloutGroup | None, Verdict | None]:
    try:
        if isinstance(raw, RolloutGroup):
            group = RolloutGroup.from_wire(raw.to_wire())
        elif isinstance(raw, (bytes, bytearray)):
            group = RolloutGroup.decode(bytes(raw))
        else:
            group = RolloutGroup.from_wire(raw)
        return group, None
    except RolloutSchemaError as exc:
        return None, Verdict(_raw_id(raw), False, (CheckResult("schema", False, str(exc)),))
    except Exception as exc:  # noqa: BLE001 - hostile input of any shape
        return None, Verdict(
            _raw_id(raw), False, (CheckResult("schema", False, f"unparseable ({type(exc).__name__})"),)
        )


def _raw_id(raw) -> bytes:
    try:
        data = bytes(raw) if isinstance(raw, (bytes, bytearray)) else repr(raw).encode()
    except Exception:  # noqa: BLE001
        data = b""
    return blake3.blake3(data).digest()


def _cheap_checks(i: int, group: RolloutGroup, models, ctx: RunContext) -> tuple[Verdict, _Pending | None]:
    checks = [CheckResult("schema", True), check_policy(group, ctx)]
    model = models.get(group.policy_version) if checks[-1].ok else None
    if checks[-1].ok and model is None:
        checks.append(
            CheckResult("model", False, f"this validator does not hold policy version {group.policy_version}")
        )
    if model is not None:
        checks.extend(check_contract(group, ctx))
        checks.append(check_assignment(group, ctx))
        checks.append(check_rendering(group, ctx))
        checks.append(check_lengths(group, ctx, model.config.vocab_size))
        checks.append(check_stop_tokens(group, ctx))
        longest = len(group.prompt_tokens) + max(len(c.tokens) for c in group.completions)
        if longest > getattr(model.config, "max_position_embeddings", longest):
            checks.append(CheckResult("length", False, f"{longest} tokens exceed the model's context"))
    verdict = Verdict(group.rollout_id(), False, tuple(checks))
    if not all(c.ok for c in checks):
        return verdict, None
    n = len(group.completions)
    return verdict, _Pending(i, group, checks, [None] * n)


def _batches(items: list[_Pending], max_batch_tokens: int) -> list[list[_Pending]]:
    """Groups batched whole, shortest first, up to max_batch_tokens padded tokens (always at least one group):
    each batch prefills its prompts once and then all their completions over the shared prompt cache, so a group's
    prompt costs one pass instead of one per completion."""
    batches: list[list[_Pending]] = [[]]
    for item in sorted(items, key=_group_width):
        batch = batches[-1]
        rows = sum(len(i.group.completions) for i in batch) + len(item.group.completions)
        if batch and rows * _group_width(item) > max_batch_tokens:
            batches.append([])
        batches[-1].append(item)
    return [b for b in batches if b]


def _group_width(item: _Pending) -> int:
    return len(item.group.prompt_tokens) + max(len(c.tokens) for c in item.group.completions) - 1


PASS_COST_TOKENS = {"cpu": 32}
"""What one more completion pass costs in padded tokens (a forward call's own overhead), per device type: the
price `length_buckets` weighs against the padding a split saves. On a CPU every token costs its full matrix work
(measured: SmolLM2 validation 9.1 -> 7.4 s). Elsewhere (a GPU) a pass of this size is bound by kernel launches and
memory, not by its padded tokens, so splitting is priced out (never measured: no GPU was available)."""
GPU_PASS_COST_TOKENS = 1 << 20


@torch.no_grad()
def _prefill_batch(model: torch.nn.Module, batch: list[_Pending]) -> list[list[torch.Tensor]]:
    """Prompts left-padded in one pass with a KV cache, then every completion's tokens [:-1] right-padded over the
    cache rows of its prompt, in passes of similar lengths (`length_buckets`: in one pass padded to the longest
    completion, 40 % of SmolLM2's benchmark completion pass is padding). The outputs at position P-1 of the prompt
    pass, then the completion passes, are each completion's last hidden states (stored in item.hidden) and, through one
    LM-head call on exactly those positions, its logits [T, V] (returned per item, per completion)."""
    from transformers.cache_utils import DynamicCache

    device = next(model.parameters()).device
    base, keyword = model.base_model, cache_keyword(model.base_model)
    prompt_ids, prompt_mask = left_padded([item.group.prompt_tokens for item in batch])
    cache = DynamicCache(config=model.config)
    last = base(input_ids=prompt_ids.to(device), attention_mask=prompt_mask.to(device), use_cache=True,
                position_ids=((prompt_mask.cumsum(dim=1) - 1).clamp(min=0)).to(device),
                **{keyword: cache}).last_hidden_state[:, -1]  # [G, H]: the output at each prompt's position P-1
    rows = [(g, item, j) for g, item in enumerate(batch) for j in range(len(item.group.completions))]
    tails = [item.group.completions[j].tokens[:-1] for _, item, j in rows]
    states: list[torch.Tensor] = [last[g][None] for g, _, _ in rows]  # per row [1 + len(tail), H]
    pass_cost = PASS_COST_TOKENS.get(device.type, GPU_PASS_COST_TOKENS)
    buckets = [b for b in length_buckets([len(t) for t in tails], pass_cost) if any(tails[r] for r in b)]
    for k, bucket in enumerate(buckets):
        own = cache if k == len(buckets) - 1 else copy.deepcopy(cache)  # the last pass may consume the original
        prompts = torch.tensor([rows[r][0] for r in bucket])
        own.batch_select_indices(prompts.to(device))
        hidden = _completion_pass(base, keyword, own, prompt_mask[prompts], [tails[r] for r in bucket], device)
        for row, out in zip(bucket, hidden):
            states[row] = torch.cat([states[row], out[: len(tails[row])]])
    lengths = [len(t) + 1 for t in tails]
    h = torch.cat(states)  # [sum T, H], row by row
    # Both stay on the model's device: the checks and the proofs' top-k run there, and a GPU validator never
    # copies [T, V] logits to the host.
    logits = _apply_head(model.get_output_embeddings(), h).float().split(lengths)
    hiddens = h.float().split(lengths)
    out: list[list[torch.Tensor]] = [[] for _ in batch]
    for r, (g, item, j) in enumerate(rows):
        item.hidden[j] = hiddens[r]
        out[g].append(logits[r])
    return out


def _completion_pass(base: torch.nn.Module, keyword: str, cache, prompt_mask: torch.Tensor,
                     tails: list[Sequence[int]], device: torch.device) -> torch.Tensor:
    """Hidden states [R, W, H] of `tails` right-padded to their longest (W), each row over `cache`'s rows of its
    prompt (`prompt_mask` [R, P] says which cached positions are real); `cache` is consumed."""
    width = max(len(t) for t in tails)
    ids = torch.zeros((len(tails), width), dtype=torch.long)
    mask = torch.zeros((len(tails), width), dtype=torch.long)
    for r, tail in enumerate(tails):
        ids[r, : len(tail)], mask[r, : len(tail)] = torch.tensor(list(tail), dtype=torch.long), 1
    positions = prompt_mask.sum(dim=1, keepdim=True) + torch.arange(width)
    return base(input_ids=ids.to(device), attention_mask=torch.cat([prompt_mask, mask], dim=1).to(device),
                position_ids=positions.to(device), use_cache=True, **{keyword: cache}).last_hidden_state


def _apply_head(head: torch.nn.Module, h: torch.Tensor) -> torch.Tensor:
    """The LM head on [T, H]; a plain Linear is applied directly, so hooks a generator installed on a shared
    module (e.g. proof capture expecting [B, L, H]) do not fire on the validator's calls."""
    if isinstance(head, torch.nn.Linear):
        return torch.nn.functional.linear(h, head.weight, head.bias)
    return head(h[None])[0]


def _reward_checks(items: list[_Pending], ctx: RunContext, config: CheckConfig) -> None:
    """The reward check of every prefilled group, one scorer round trip for all (each logit-checked group gets it
    last among its logit checks, as check order is part of the vote)."""
    try:
        results = check_rewards_many([item.group for item in items], ctx, config)
    except Exception as exc:  # noqa: BLE001 - a crash here rejects these groups, never the validator
        results = [CheckResult("internal", False, f"check raised {type(exc).__name__}")] * len(items)
    for item, result in zip(items, results):
        item.logit_checks.append(result)


def _proof_checks(items: list[_Pending], config: CheckConfig) -> list[CheckResult]:
    """The TOPLOC check of every prefilled group in one batched call (per-group calls cost 2 x 128 numpy steps each)."""
    try:
        return check_proofs_many([item.group for item in items], [item.hidden for item in items], config)
    except Exception as exc:  # noqa: BLE001 - a crash here rejects these groups, never the validator
        return [CheckResult("internal", False, f"check raised {type(exc).__name__}")] * len(items)


def _logit_checks(group: RolloutGroup, logits: list[torch.Tensor], ctx: RunContext,
                  config: CheckConfig) -> list[CheckResult]:
    """Termination, sampling and logprobs of one prefilled group, from its logits ([T_j, V] per completion)."""
    checks: list[CheckResult] = []
    try:
        lengths = [len(c.tokens) for c in group.completions]
        recomputed = recomputed_logprobs(torch.cat(logits), [t for c in group.completions for t in c.tokens],
                                         ctx.temperature).split(lengths)
        last_probs = [float(torch.exp(lp[-1])) for lp in recomputed]
        checks.append(check_termination(group, last_probs, ctx, config))
        checks.append(check_sampling(group, logits, config, ctx.temperature))
        checks.append(check_logprobs(group, recomputed, config))  # the reward check follows (_reward_checks)
    except Exception as exc:  # noqa: BLE001 - a crash while checking rejects this group only
        checks.append(CheckResult("internal", False, f"check raised {type(exc).__name__}"))
    return checks
