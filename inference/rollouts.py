"""Turning generated groups into RolloutGroup wire objects, with the worker's claimed rewards.

Why the keys are checked here: the sampling keys fix the Gumbel noise, and a validator re-derives them from the
rollout's (run, worker, step, task_index, completion index); a group generated under other keys would fail the
sampling check, so the mismatch is caught where it is cheapest, before publishing.
"""

from __future__ import annotations

from inference.backend import GenerationRequest, GroupResult
from tasks.prompts import decode_completion, render_prompt_tokens
from tasks.taskset import TaskEntry
from verify.rewards import compute_rewards
from verify.rollout import Completion, RolloutGroup
from verify.sampling import SamplingKey


def sampling_keys(run: str, worker: str, step: int, task_index: int, group_size: int) -> tuple[SamplingKey, ...]:
    """The keys of completions 0..group_size-1 of one assigned prompt."""
    return tuple(SamplingKey(run, worker, step, task_index, s) for s in range(group_size))


def make_request(tokenizer, entry: TaskEntry, *, run: str, worker: str, step: int, group_size: int,
                 temperature: float, max_new_tokens: int) -> GenerationRequest:
    """The request for one assigned prompt: chat-rendered tokens and the group's sampling keys."""
    return GenerationRequest(prompt_tokens=tuple(render_prompt_tokens(tokenizer, entry)),
                             keys=sampling_keys(run, worker, step, entry.index, group_size),
                             temperature=temperature, max_new_tokens=max_new_tokens)


def build_rollout_group(result: GroupResult, entry: TaskEntry, tokenizer, *, run: str, worker: str,
                        step: int) -> RolloutGroup:
    """The wire rollout of `result` for prompt `entry`, each completion scored with the task's reward function."""
    request = result.request
    expected = sampling_keys(run, worker, step, entry.index, len(request.keys))
    if request.keys != expected:
        raise ValueError(f"group for task {entry.index} was sampled with keys that do not match run {run!r}, "
                         f"worker {worker!r}, step {step}")
    rewards = compute_rewards(entry.reward_fn, [decode_completion(tokenizer, c.tokens) for c in result.completions],
                              entry.to_dict())
    completions = tuple(
        Completion(tokens=c.tokens, logprobs=tuple(min(lp, 0.0) for lp in c.logprobs), finish_reason=c.finish_reason,
                   reward=reward, proof=c.proof)
        for c, reward in zip(result.completions, rewards)
    )
    return RolloutGroup(run=run, policy_version=result.policy_version, manifest_id=result.manifest_id, worker=worker,
                        step=step, dataset=entry.dataset, task_index=entry.index,
                        prompt_tokens=tuple(request.prompt_tokens), temperature=request.temperature,
                        max_new_tokens=request.max_new_tokens, completions=completions)
