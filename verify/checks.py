"""The rollout checks a validator runs, each a pure function returning a named CheckResult.

Why pure: every check is a decision over data the validator already holds (the group, the run's context, and the
tensors of its own prefill), so each is tested on hand-built honest and dishonest cases without a model, and the
verifier (verify/verifier.py) only computes the tensors and calls these in order.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np
import torch

from tasks.assignment import is_assigned
from verify.neartie import count_near_ties
from verify.rewards import compute_rewards_many
from verify.rollout import RolloutGroup
from verify.sampling import SamplingKey, gumbel_noise_at, perturb_, stream_seeds
from verify.toploc import ToplocConfig, verify_proofs
from verify.verdicts import CheckResult

PRECISIONS = ("float32", "bfloat16")  # what a run's workers may generate in; each has its tolerances


@dataclass(frozen=True)
class CheckConfig:
    """Tolerances of the checks. Defaults suit float32 workers; `for_precision("bfloat16")` widens them for bf16.

    near_tie_tol: a re-derived token that differs from the claimed one is a near-tie when the claimed token's
      perturbed score (logits / T + Gumbel noise) is within this of the best one; larger gaps reject at once.
    max_near_tie_fraction: near-ties allowed per group, as a fraction of its tokens (at least one is always allowed).
    logprob_atol: largest allowed |claimed - recomputed| sampling logprob.
    reward_atol: largest allowed |claimed - recomputed| reward.
    min_eos_prob: a completion ending with EOS must have given EOS more than this probability (INTELLECT-2: 0.1).
    toploc: the proof thresholds.
    """

    near_tie_tol: float = 0.02
    max_near_tie_fraction: float = 0.01
    logprob_atol: float = 0.02
    reward_atol: float = 1e-6
    min_eos_prob: float = 0.1
    toploc: ToplocConfig = field(default_factory=ToplocConfig)

    @classmethod
    def for_precision(cls, precision: str, **overrides) -> "CheckConfig":
        """The tolerances for workers that generate in `precision` (the run's, from its manifest), checked by
        float32 validators.

        float32: the defaults. bfloat16 (vLLM on GPUs): two honest kernels' bf16 logits differ by far more than
        float32 ones. Measured on CPU, bf16 workers against a float32 prefill: SmolLM2-135M (704 tokens)
        logprobs differ by up to 0.31, 1.6 % of tokens re-derive as another token, with score gaps up to 0.21;
        the tiny model up to 0.07, 0.8 % and 0.06. These tolerances leave a margin of about two and a half on
        SmolLM2's; the price is a weaker sampling check, which then catches only sampling changes that move a
        token's score by more than 0.5 or flip more than 6 % of tokens (`swarm bench verify --precision bfloat16`
        reports which attacks that leaves undetected). TOPLOC's reference thresholds already target bf16.
        """
        if precision not in PRECISIONS:
            raise ValueError(f"unknown precision {precision!r}: choose from {', '.join(PRECISIONS)}")
        widened = {"near_tie_tol": 0.5, "max_near_tie_fraction": 0.06, "logprob_atol": 0.75}
        return cls(**{**(widened if precision == "bfloat16" else {}), **overrides})


class TaskProvider(Protocol):
    """What a validator needs from the run's task set: rendered prompts, task entries and detokenisation."""

    def prompt_tokens(self, dataset: str, index: int) -> Sequence[int] | None:
        """The run's rendering of task `index` (None when the dataset or index does not exist)."""

    def entry(self, dataset: str, index: int) -> dict | None:
        """The task's wire dict (prompt, answer, metadata, reward_fn), None when it does not exist."""

    def decode(self, tokens: Sequence[int]) -> str:
        """Completion text as the reward functions see it."""


@dataclass(frozen=True)
class RunContext:
    """What the validator knows about the run at the moment it checks a group.

    run: the run's name. current_version: the newest policy version the validator knows. async_window: how many
    versions older than current a rollout may be (INTELLECT-2: 2). manifest_ids: version -> manifest id from the
    trainer's signed manifests. max_new_tokens: the stage's generation limit. dataset: the stage's task set;
    eligible: its eligible indices (sorted), prompts_per_step: prompts assigned to each worker per step.
    eos_ids: token ids that end a completion, the run's stop tokens (empty for a model without EOS). tasks: the
    task provider. temperature, group_size: the sampling temperature and completions per prompt.

    Every generation setting here comes from the version's signed manifest (its generation settings, its model
    description for the stop tokens and the chat rendering, its run spec for the precision's tolerances): the
    signed run is the contract, and a group's own claims are only ever compared with it (check_contract).
    """

    run: str
    current_version: int
    async_window: int
    manifest_ids: Mapping[int, bytes]
    max_new_tokens: int
    dataset: str
    eligible: Sequence[int]
    prompts_per_step: int
    eos_ids: tuple[int, ...]
    tasks: TaskProvider
    temperature: float
    group_size: int


def _result(name: str, problems: list[str]) -> CheckResult:
    return CheckResult(name, not problems, problems[0] if problems else "")


def check_policy(group: RolloutGroup, ctx: RunContext) -> CheckResult:
    """Version inside the async window and manifest id equal to the trainer's manifest for that version."""
    problems = []
    oldest = ctx.current_version - ctx.async_window
    if group.run != ctx.run:
        problems.append(f"rollout belongs to run {group.run!r}, not {ctx.run!r}")
    elif not oldest <= group.policy_version <= ctx.current_version:
        problems.append(
            f"policy version {group.policy_version} is outside the window [{oldest}, {ctx.current_version}]")
    elif ctx.manifest_ids.get(group.policy_version) != group.manifest_id:
        problems.append(f"manifest id does not match the trainer's manifest of version {group.policy_version}")
    return _result("policy", problems)


def check_assignment(group: RolloutGroup, ctx: RunContext) -> CheckResult:
    """The prompt is one the seeded schedule assigned to this worker at this step."""
    problems = []
    if group.dataset != ctx.dataset:
        problems.append(f"dataset {group.dataset!r} is not the stage's {ctx.dataset!r}")
    elif not is_assigned(ctx.run, group.worker, group.step, ctx.eligible, ctx.prompts_per_step, group.task_index):
        problems.append(f"task {group.task_index} was not assigned to {group.worker} at step {group.step}")
    return _result("assignment", problems)


def check_rendering(group: RolloutGroup, ctx: RunContext) -> CheckResult:
    """The prompt tokens are the run's own rendering of the task (its tokenizer and chat template, from the
    manifest's model description), token for token."""
    rendered = ctx.tasks.prompt_tokens(group.dataset, group.task_index)
    ok = rendered is not None and tuple(rendered) == group.prompt_tokens
    return _result("rendering", [] if ok else ["prompt tokens differ from the run's rendering of the task"])


def check_contract(group: RolloutGroup, ctx: RunContext) -> list[CheckResult]:
    """The group against the run's signed generation settings, one named check each: `temperature` (the value it
    repeats), `group_size` (how many completions it holds) and `max_new_tokens` (the value it repeats, and no
    completion longer). Why each its own name: a validator's vote says which setting a worker broke, and a group
    sampled at another temperature, greedy decoding sent n times, or fewer or more completions than the run asks
    for are each refused here, before any prefill, whatever the group claims about itself."""
    temperature, size = [], []
    if group.temperature != ctx.temperature:
        temperature.append(f"temperature {group.temperature} is not the run's {ctx.temperature}")
    if len(group.completions) != ctx.group_size:
        size.append(f"{len(group.completions)} completions, the run's group size is {ctx.group_size}")
    return [_result("temperature", temperature), _result("group_size", size),
            _result("max_new_tokens", _limit_problems(group, ctx.max_new_tokens))]


def _limit_problems(group: RolloutGroup, limit: int) -> list[str]:
    problems = []
    if group.max_new_tokens != limit:
        problems.append(f"max_new_tokens {group.max_new_tokens} is not the run's {limit}")
    for i, c in enumerate(group.completions):
        if len(c.tokens) > limit:
            problems.append(f"completion {i} has {len(c.tokens)} tokens, over the run's {limit}")
    return problems


def check_stop_tokens(group: RolloutGroup, ctx: RunContext) -> CheckResult:
    """Every completion stops at its first stop token (the run's EOS ids) and only there: none continues past one,
    one claiming EOS ends with one, one claiming the length limit does not."""
    problems = []
    eos = set(ctx.eos_ids)
    for i, c in enumerate(group.completions):
        if not eos.isdisjoint(c.tokens[:-1]):  # a C-level pass; the loop only runs to name the position
            early = next(j for j, t in enumerate(c.tokens) if t in eos)
            problems.append(f"completion {i} continues after the stop token at position {early}")
        elif (c.finish_reason == "eos") != (c.tokens[-1] in eos):
            problems.append(f"completion {i} claims {c.finish_reason!r} but ends with token {c.tokens[-1]}")
    return _result("stop_tokens", problems)


def check_lengths(group: RolloutGroup, ctx: RunContext, vocab_size: int) -> CheckResult:
    """Every token inside the model's vocabulary (the run's limits are check_contract's)."""
    problems = []
    if any(t >= vocab_size for t in group.prompt_tokens) or any(
        t >= vocab_size for c in group.completions for t in c.tokens
    ):
        problems.append(f"a token id is outside the vocabulary of {vocab_size}")
    return _result("length", problems)


def check_termination(
    group: RolloutGroup, eos_probs: Sequence[float], ctx: RunContext, config: CheckConfig
) -> CheckResult:
    """A completion ending with EOS gave it P(EOS) > min_eos_prob there (eos_probs[i]: completion i's last-step
    probability of its last token under softmax(logits / T)); one ending otherwise has exactly the length limit.
    Where the stop tokens sit is check_stop_tokens'."""
    problems = []
    for i, (c, p_last) in enumerate(zip(group.completions, eos_probs)):
        if c.finish_reason == "eos" and not p_last > config.min_eos_prob:
            problems.append(f"completion {i} ends with EOS of probability {p_last:.3g} <= {config.min_eos_prob}")
        elif c.finish_reason == "length" and len(c.tokens) != ctx.max_new_tokens:
            problems.append(
                f"completion {i} claims the length limit but has {len(c.tokens)} of {ctx.max_new_tokens} tokens"
            )
    return _result("termination", problems)


def check_sampling(group: RolloutGroup, logits: Sequence[torch.Tensor], config: CheckConfig,
                   temperature: float) -> CheckResult:
    """Re-derive every token with the seeded Gumbel-max sampler from the validator's logits ([T_i, V] per completion)
    at the run's `temperature` (the manifest's, never the group's claim).

    A mismatch whose score gap is below near_tie_tol is a near-tie (kernel noise); more than the allowed number of
    near-ties, or any larger gap, rejects the group. The noise of every position of every completion is one draw
    and the scores one tensor op (per-completion calls cost more than the arithmetic on small vocabularies).
    """
    lengths = [len(c.tokens) for c in group.completions]
    keys = [SamplingKey(group.run, group.worker, group.step, group.task_index, i) for i in range(len(lengths))]
    positions = np.concatenate([np.arange(n) for n in lengths])
    noise = gumbel_noise_at(np.repeat(stream_seeds(keys), lengths), positions, logits[0].shape[-1], logits[0].device)
    scores = perturb_(torch.cat([lg.float() for lg in logits]), noise, temperature)  # cat: a fresh buffer
    tokens = torch.tensor([t for c in group.completions for t in c.tokens], device=scores.device)
    claimed = scores.gather(-1, tokens[:, None]).squeeze(-1)
    gaps = scores.max(dim=-1).values - claimed
    record = count_near_ties(gaps)
    if not (bool(torch.isfinite(gaps).all()) and float(gaps.max()) <= config.near_tie_tol):
        return dataclasses.replace(_first_sampling_failure(gaps.split(lengths), config), near_ties=record)
    near_ties = int((gaps > 0).sum())
    allowed = max(1, math.floor(config.max_near_tie_fraction * sum(lengths)))
    if near_ties > allowed:
        return CheckResult("sampling", False, f"{near_ties} near-tie tokens, at most {allowed} allowed", record)
    return CheckResult("sampling", True, near_ties=record)


def _first_sampling_failure(gaps: Sequence[torch.Tensor], config: CheckConfig) -> CheckResult:
    """The rejection naming the first completion with a non-finite score or a gap beyond near_tie_tol."""
    for i, gap in enumerate(gaps):
        if not bool(torch.isfinite(gap).all()):
            return CheckResult("sampling", False, f"completion {i} has non-finite scores")
        worst = float(gap.max())
        if worst > config.near_tie_tol:
            pos = int(gap.argmax())
            return CheckResult(
                "sampling", False, f"completion {i} token {pos} is not the seeded sample (gap {worst:.3g})"
            )
    raise AssertionError("called without a failing completion")


def recomputed_logprobs(logits: torch.Tensor, tokens: Sequence[int], temperature: float) -> torch.Tensor:
    """Sampling logprobs of `tokens` under softmax(logits / T) (T = 1 for greedy), as verify.sampling defines them."""
    scaled = logits.float() / (temperature if temperature > 0 else 1.0)
    index = torch.tensor(list(tokens), device=logits.device)[:, None]
    return torch.log_softmax(scaled, dim=-1).gather(-1, index).squeeze(-1)


def check_logprobs(group: RolloutGroup, recomputed: Sequence[torch.Tensor], config: CheckConfig) -> CheckResult:
    """Claimed sampling logprobs agree with the recomputed ones within logprob_atol (one vectorised comparison
    for the group; the per-completion loop only runs to name a failure)."""
    claimed = torch.tensor([lp for c in group.completions for lp in c.logprobs], dtype=torch.float32,
                           device=recomputed[0].device)
    diff = (claimed - torch.cat([lp.float() for lp in recomputed])).abs()
    if bool(torch.isfinite(diff).all()) and float(diff.max()) <= config.logprob_atol:
        return CheckResult("logprobs", True)
    for i, (c, lp) in enumerate(zip(group.completions, recomputed)):
        diff = (torch.tensor(c.logprobs, dtype=torch.float32, device=lp.device) - lp.float()).abs()
        if not bool(torch.isfinite(diff).all()) or float(diff.max()) > config.logprob_atol:
            return CheckResult("logprobs", False, f"completion {i} logprobs differ by up to {float(diff.max()):.3g}")
    return CheckResult("logprobs", True)


def check_rewards(group: RolloutGroup, ctx: RunContext, config: CheckConfig) -> CheckResult:
    """Every claimed reward is in [0, 1] and equals the reward recomputed with the task's own reward function."""
    return check_rewards_many([group], ctx, config)[0]


def check_rewards_many(groups: Sequence[RolloutGroup], ctx: RunContext, config: CheckConfig) -> list[CheckResult]:
    """check_rewards of many groups with one scorer round trip for all of them (compute_rewards_many)."""
    results: list[CheckResult | None] = []
    jobs, scored = [], []  # the scorer's jobs, and the index in `results` each answers
    for group in groups:
        entry = ctx.tasks.entry(group.dataset, group.task_index)
        bad = next((i for i, c in enumerate(group.completions) if not 0.0 <= c.reward <= 1.0), None)
        if entry is None:
            results.append(CheckResult("reward", False, f"task {group.dataset}[{group.task_index}] does not exist"))
        elif bad is not None:
            claimed = group.completions[bad].reward
            results.append(CheckResult("reward", False, f"completion {bad} claims reward {claimed} outside [0, 1]"))
        else:
            results.append(None)
            scored.append(len(results) - 1)
            jobs.append((entry.get("reward_fn", "exact"), [ctx.tasks.decode(c.tokens) for c in group.completions],
                         entry))
    for index, wanted in zip(scored, compute_rewards_many(jobs)):
        results[index] = _judge_rewards(groups[index], wanted, config)
    return results


def _judge_rewards(group: RolloutGroup, wanted: list[float], config: CheckConfig) -> CheckResult:
    for i, (c, want) in enumerate(zip(group.completions, wanted)):
        if abs(want - c.reward) > config.reward_atol:
            return CheckResult("reward", False, f"completion {i} claims reward {c.reward}, recomputed {want}")
    return CheckResult("reward", True)


def check_proofs(group: RolloutGroup, hidden: Sequence[torch.Tensor], config: CheckConfig) -> CheckResult:
    """Every completion's TOPLOC proof matches the validator's own last hidden states ([T_i, H] each)."""
    return check_proofs_many([group], [hidden], config)[0]


def check_proofs_many(groups: Sequence[RolloutGroup], hiddens: Sequence[Sequence[torch.Tensor]],
                      config: CheckConfig) -> list[CheckResult]:
    """check_proofs of many groups with one verify_proofs call: its cost is per call (2 x 128 vectorised steps),
    not per chunk, so a validator checks every group of a batch at once."""
    results = iter(verify_proofs([c.proof for g in groups for c in g.completions],
                                 [h for hs in hiddens for h in hs], config.toploc))
    out = []
    for group in groups:
        failed = [f"completion {i}: {r.reason}" for i, r in enumerate([next(results) for _ in group.completions])
                  if not r.ok]
        out.append(CheckResult("toploc", False, failed[0]) if failed else CheckResult("toploc", True))
    return out
