"""Small, honest reference pieces for tests and `swarm bench verify`: tiny models, a byte tokenizer, a generator.

Why here: verification must be tested against *real* generation (KV-cached decoding, the seeded Gumbel-max sampler,
hidden states captured while decoding), independently of the production backend in inference/. This generator is a
plain loop over any HF causal LM; it batches the n completions of one prompt (same length, so no padding), which
is deliberately a different batch composition than the validator's padded multi-group prefill.

Precision: the tiny models run in float32. TOPLOC's reference thresholds were tuned for bf16 noise across GPUs;
float32 on one CPU is far quieter, so honest proofs pass with almost no error (see `swarm bench verify`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from tasks.assignment import assign_tasks
from verify import sampling
from verify.rewards import compute_reward
from verify.rollout import Completion, RolloutGroup
from verify.sampling import SamplingKey, gumbel_noise_batch, sample_tokens
from verify.toploc import build_proofs

PAD_ID, BOS_ID, EOS_ID = 0, 1, 2


def textbook_gumbel_noise(seeds: np.ndarray, positions: np.ndarray, vocab_size: int) -> torch.Tensor:
    """verify.sampling's noise written as its definition reads, in whole-array numpy (numpy's logs): the oracle
    of the blocked CPU draw and the device draw, and the baseline `swarm bench noise` times them against."""
    row_seeds = sampling._splitmix64(np.asarray(seeds, dtype=np.uint64), np.asarray(positions, dtype=np.uint64))
    bits = sampling._splitmix64(row_seeds[:, None], np.arange(vocab_size, dtype=np.uint64)[None, :])
    uniform = ((bits >> np.uint64(11)).astype(np.float64) + 0.5) * 2.0**-53
    return torch.from_numpy(-np.log((-np.log(uniform)).astype(np.float32)))
_BYTE_OFFSET = 3


class ByteTokenizer:
    """Bytes shifted by 3 (0 pad, 1 bos, 2 eos); ids at or above 259 decode to nothing. Enough for tests."""

    eos_token_id = EOS_ID
    pad_token_id = PAD_ID

    def encode(self, text: str) -> list[int]:
        return [BOS_ID] + [b + _BYTE_OFFSET for b in text.encode("utf-8")]

    def decode(self, tokens) -> str:
        data = bytes(t - _BYTE_OFFSET for t in tokens if _BYTE_OFFSET <= t < 256 + _BYTE_OFFSET)
        return data.decode("utf-8", errors="replace")


def tiny_model(seed: int = 0, *, hidden: int = 128, layers: int = 2, vocab: int = 512, eos_boost: float = 0.0):
    """A random Qwen2ForCausalLM (float32, eval mode). Init std 0.2 instead of 0.02 gives peaked next-token
    distributions (like a trained model) rather than near-uniform ones; `eos_boost` scales the EOS row of the LM
    head so some completions end with EOS."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(
        vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048, tie_word_embeddings=False,
        initializer_range=0.2, bos_token_id=BOS_ID, eos_token_id=EOS_ID, pad_token_id=PAD_ID,
    )
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(config).eval()
    if eos_boost:
        with torch.no_grad():
            model.lm_head.weight[EOS_ID] *= eos_boost
    return model


@dataclass(frozen=True)
class Generated:
    """One completion: tokens, sampling logprobs, finish reason, last hidden states [T, H] and the TOPLOC proof."""

    tokens: tuple[int, ...]
    logprobs: tuple[float, ...]
    finish_reason: str
    hidden: torch.Tensor
    proof: bytes


@torch.no_grad()
def generate_group(model, prompt: list[int], keys: list[SamplingKey], temperature: float, max_new_tokens: int,
                   eos_ids: tuple[int, ...] = (EOS_ID,), *, with_proofs: bool = True, choose=None) -> list[Generated]:
    """Sample len(keys) completions of `prompt` with KV caching; row i uses keys[i]'s noise stream.

    hidden[t] is the final-norm output at the position whose logits sampled token t (see verify.toploc).
    choose(logits [B, V], noise [B, V], temperature, live [B] bool) -> (tokens [B], logprobs [B]) picks each
    step's tokens: the seeded sampler by default, a cheating worker's rule in swarm/bench/attacks.py.
    """
    n = len(keys)
    vocab = model.config.vocab_size
    out = model(input_ids=torch.tensor([prompt] * n), use_cache=True, output_hidden_states=True)
    past, logits, hidden = out.past_key_values, out.logits[:, -1], out.hidden_states[-1][:, -1]
    tokens, logprobs, states = [], [], []
    done = torch.zeros(n, dtype=torch.bool)
    for position in range(max_new_tokens):
        noise = gumbel_noise_batch(keys, [position] * n, vocab)
        if choose is None:
            token, logprob = sample_tokens(logits, noise, temperature)
        else:
            token, logprob = choose(logits, noise, temperature, ~done)
        tokens.append(token)
        logprobs.append(logprob)
        states.append(hidden.float())
        done |= torch.isin(token, torch.tensor(eos_ids))
        if bool(done.all()) or position + 1 == max_new_tokens:
            break
        out = model(input_ids=token[:, None], cache=past, use_cache=True, output_hidden_states=True)
        past, logits, hidden = out.past_key_values, out.logits[:, -1], out.hidden_states[-1][:, -1]
    return _finish(torch.stack(tokens, 1), torch.stack(logprobs, 1), torch.stack(states, 1), eos_ids, with_proofs)


def _finish(tokens, logprobs, states, eos_ids, with_proofs: bool) -> list[Generated]:
    """Cut each row at its first EOS and build all proofs in one batched call."""
    rows = []
    for i in range(tokens.shape[0]):
        row = tokens[i].tolist()
        ends = [j for j, t in enumerate(row) if t in eos_ids]
        length = ends[0] + 1 if ends else len(row)
        rows.append((row[:length], logprobs[i, :length].tolist(), "eos" if ends else "length", states[i, :length]))
    proofs = build_proofs([r[3] for r in rows]) if with_proofs else [b""] * len(rows)
    return [Generated(tuple(t), tuple(lp), f, h, p) for (t, lp, f, h), p in zip(rows, proofs)]


class GymTasks:
    """A TaskProvider over one reasoning-gym dataset with the byte tokenizer (prompt = BOS + the question's bytes)."""

    def __init__(self, name: str = "basic_arithmetic", size: int = 64, seed: int = 0) -> None:
        import reasoning_gym

        self.name, self.size = name, size
        self._data = reasoning_gym.create_dataset(name, size=size, seed=seed)
        self.tokenizer = ByteTokenizer()

    def _valid(self, dataset: str, index: int) -> bool:
        return dataset == self.name and 0 <= index < self.size

    def prompt_tokens(self, dataset: str, index: int) -> list[int] | None:
        return self.tokenizer.encode(self._data[index]["question"]) if self._valid(dataset, index) else None

    def entry(self, dataset: str, index: int) -> dict | None:
        if not self._valid(dataset, index):
            return None
        item = self._data[index]
        return {"dataset": self.name, "index": index, "prompt": item["question"], "answer": item["answer"],
                "metadata": item["metadata"], "reward_fn": f"rg:{self.name}"}

    def decode(self, tokens) -> str:
        return self.tokenizer.decode(tokens)


def honest_group(model, ctx, *, worker: str, step: int, version: int, group_size: int, temperature: float,
                 pick: int = 0, choose=None):
    """Generate the `pick`-th prompt assigned to `worker` at `step` honestly (or with generate_group's `choose`)
    and wrap it as a RolloutGroup."""
    index = assign_tasks(ctx.run, worker, step, ctx.eligible, ctx.prompts_per_step)[pick]
    prompt = list(ctx.tasks.prompt_tokens(ctx.dataset, index))
    keys = [SamplingKey(ctx.run, worker, step, index, i) for i in range(group_size)]
    generated = generate_group(model, prompt, keys, temperature, ctx.max_new_tokens, ctx.eos_ids, choose=choose)
    entry = ctx.tasks.entry(ctx.dataset, index)
    completions = tuple(
        Completion(g.tokens, g.logprobs, g.finish_reason,
                   compute_reward(entry["reward_fn"], ctx.tasks.decode(g.tokens), entry), g.proof)
        for g in generated
    )
    return RolloutGroup(run=ctx.run, policy_version=version, manifest_id=ctx.manifest_ids[version], worker=worker,
                        step=step, dataset=ctx.dataset, task_index=index, prompt_tokens=tuple(prompt),
                        temperature=temperature, max_new_tokens=ctx.max_new_tokens, completions=completions)
