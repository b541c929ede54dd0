"""Batched, KV-cached generation over a transformers causal LM, with seeded Gumbel-max sampling and TOPLOC proofs.

How one batch runs: the distinct prompts are prefilled once, left-padded (attention mask + explicit position ids
keep a padded row identical to the same row alone, up to float noise); the cache rows are then repeated so each
prompt has one row per completion. Every row starts decoding together, so at step s each live row generates its
token s: tokens, logprobs and the captured LM-head inputs live in [rows, max_new] buffers written with one indexed
copy per step, and the Gumbel noise of all live rows is one vectorised draw per step (verify.sampling). A finished
row leaves the cache at once (no compute on dead rows); the batch's proofs are built in one vectorised call when its
last row finishes. Proofs are not built on a worker thread while decoding goes on: the
numpy loops of the proof build hold the GIL between the decoder's many short torch calls (a convoy), which doubles
wall time on the tiny model, and more calls cost more (a build's cost is per call, not per chunk).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from inference.backend import BASE_MANIFEST_ID, CompletionResult, GenerationRequest, GroupResult
from inference.models import LoadedModel
from inference.weights import load_weights_in_place
from verify.model_inputs import cache_keyword, left_padded
from verify.sampling import SamplingKey, gumbel_noise_at, sample_tokens, stream_seeds
from verify.toploc import build_proofs

ProofFn = Callable[[list[torch.Tensor]], list[bytes]]  # hidden [T, H] per completion -> TOPLOC proof bytes each


def default_proof_fn() -> ProofFn:
    return build_proofs


class TorchBackend:
    """GenerationBackend over a LoadedModel on the CPU (or wherever its parameters live).

    capture_proofs: record LM-head inputs and build proofs (off only for benchmarks and tests that time the
    difference); max_batch_rows: completions decoded together; proof_fn: the proof builder (verify.toploc).
    """

    def __init__(self, loaded: LoadedModel, *, capture_proofs: bool = True, max_batch_rows: int = 64,
                 proof_fn: ProofFn | None = None) -> None:
        self.loaded = loaded
        self.model = loaded.model
        self.eos_ids = torch.tensor(sorted(loaded.eos_token_ids), dtype=torch.long)
        pad = getattr(loaded.tokenizer, "pad_token_id", None)
        self.pad_id = int(pad) if pad is not None else 0  # padded positions are masked: any valid id will do
        self.capture_proofs = capture_proofs
        self.max_batch_rows = max_batch_rows
        self.proof_fn = proof_fn  # resolved on first use, so a backend built without proofs imports no verifier
        self.policy_version = 0
        self.manifest_id = BASE_MANIFEST_ID
        self._captured: torch.Tensor | None = None
        self._cache_kw = cache_keyword(self.model)
        self.model.get_output_embeddings().register_forward_pre_hook(self._capture_hook)

    def _proof_fn(self) -> ProofFn:
        if self.proof_fn is None:
            self.proof_fn = default_proof_fn()
        return self.proof_fn

    def _capture_hook(self, module, args) -> None:
        """Keeps the LM head's input of the last position: the hidden state TOPLOC commits to."""
        if self.capture_proofs:
            self._captured = args[0][:, -1, :]

    def load_policy(self, directory: str, *, version: int, manifest_id: bytes) -> None:
        if len(manifest_id) != 32:
            raise ValueError("manifest_id must be 32 bytes")
        load_weights_in_place(self.model, directory)
        self.policy_version, self.manifest_id = version, manifest_id

    def generate(self, requests: Sequence[GenerationRequest]) -> list[GroupResult]:
        rows = [(r, k) for r, req in enumerate(requests) for k in range(len(req.keys))]
        results: dict[tuple[int, int], CompletionResult] = {}
        for start in range(0, len(rows), self.max_batch_rows):
            chunk = rows[start:start + self.max_batch_rows]
            for row, completion in zip(chunk, self._generate_rows(requests, chunk)):
                results[row] = completion
        return [
            GroupResult(request=req, completions=tuple(results[(r, k)] for k in range(len(req.keys))),
                        policy_version=self.policy_version, manifest_id=self.manifest_id)
            for r, req in enumerate(requests)
        ]

    @torch.no_grad()
    def _generate_rows(
        self, requests: Sequence[GenerationRequest], rows: list[tuple[int, int]]
    ) -> list[CompletionResult]:
        device = next(self.model.parameters()).device
        distinct = sorted({r for r, _ in rows})
        prompts = [requests[r].prompt_tokens for r in distinct]
        cache, logits, mask = self._prefill(prompts, device)
        expand = torch.tensor([distinct.index(r) for r, _ in rows], device=device)
        cache.batch_select_indices(expand)
        hidden = self._captured[expand] if self.capture_proofs else None
        state = _DecodeState(rows=[(requests[r], requests[r].keys[k]) for r, k in rows], width=logits.shape[-1],
                             hidden_size=self.model.config.hidden_size if hidden is None else hidden.shape[-1],
                             capture=self.capture_proofs, device=device)
        logits, mask, positions = logits[expand], mask[expand], mask[expand].sum(dim=1, keepdim=True) - 1
        while True:
            finished = state.step(logits, hidden, self.eos_ids)
            for row in finished:
                state.finish(row)
            keep = state.live_positions()
            if not keep:
                return state.completions(self._proof_fn() if self.capture_proofs else None)
            if finished:
                keep_t = torch.tensor(keep, device=device)
                cache.batch_select_indices(keep_t)
                mask, positions = mask[keep_t], positions[keep_t]
                state.compact(keep)
            mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=1)
            positions = positions + 1
            out = self.model(input_ids=state.last_tokens().to(device), attention_mask=mask, position_ids=positions,
                             use_cache=True, logits_to_keep=1, **{self._cache_kw: cache})
            logits, hidden = out.logits[:, -1, :], self._captured

    def _prefill(self, prompts: list[tuple[int, ...]], device: torch.device):
        """Left-padded prefill: returns (cache, last-position logits [P, V], attention mask [P, L]), on `device`."""
        from transformers.cache_utils import DynamicCache

        ids, mask = (t.to(device) for t in left_padded(prompts, self.pad_id))
        positions = (mask.cumsum(dim=1) - 1).clamp(min=0)
        cache = DynamicCache(config=self.model.config)
        out = self.model(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=True,
                         logits_to_keep=1, **{self._cache_kw: cache})
        return cache, out.logits[:, -1, :], mask


class _DecodeState:
    """Per-batch bookkeeping: which rows are live, their tokens, logprobs and captured hidden states.

    Buffers are indexed by the original row; `live` maps the current cache row order to original rows. Tokens and
    logprobs are kept on the CPU (the finish checks read them every step anyway); the captured hidden states stay
    on the model's device, where the proofs' top-k then runs.
    """

    def __init__(self, rows: list[tuple[GenerationRequest, SamplingKey]], width: int, hidden_size: int,
                 capture: bool, device: torch.device | None = None) -> None:
        self.rows = rows
        self.seeds = stream_seeds([key for _, key in rows])  # hashed once per row, not per token
        self.limits = torch.tensor([req.max_new_tokens for req, _ in rows])
        self.temperatures = torch.tensor([req.temperature for req, _ in rows], dtype=torch.float64)
        steps = int(self.limits.max())
        self.tokens = torch.zeros((len(rows), steps), dtype=torch.long)
        self.logprobs = torch.zeros((len(rows), steps), dtype=torch.float32)
        self.hidden = torch.zeros((len(rows), steps, hidden_size), device=device) if capture else None
        self.width = width
        self.live = list(range(len(rows)))
        self.position = 0
        self.lengths: dict[int, int] = {}
        self.reasons: dict[int, str] = {}

    def step(self, logits: torch.Tensor, hidden: torch.Tensor | None, eos_ids: torch.Tensor) -> list[int]:
        """Sample every live row's next token; returns the positions (in `live`) of rows that just finished."""
        live_t = torch.tensor(self.live)
        noise = gumbel_noise_at(
            self.seeds[self.live], [self.position] * len(self.live), logits.shape[-1], logits.device
        )
        temperatures = self.temperatures[live_t]
        if bool((temperatures == temperatures[0]).all()):  # the usual case: one temperature, one call
            tokens, logprobs = (t.cpu() for t in sample_tokens(logits, noise, float(temperatures[0])))
        else:
            tokens = torch.empty(len(self.live), dtype=torch.long)
            logprobs = torch.empty(len(self.live), dtype=torch.float32)
            for temperature in temperatures.unique().tolist():
                sel = temperatures == temperature
                picked = sample_tokens(logits[sel.to(logits.device)], noise[sel.to(noise.device)], temperature)
                tokens[sel], logprobs[sel] = (t.cpu() for t in picked)
        self.tokens[live_t, self.position] = tokens
        self.logprobs[live_t, self.position] = logprobs
        if self.hidden is not None:
            self.hidden[live_t.to(self.hidden.device), self.position] = hidden.to(self.hidden.dtype)
        self.position += 1
        is_eos = torch.isin(tokens, eos_ids)
        finished = (is_eos | (self.limits[live_t] <= self.position)).nonzero().flatten().tolist()
        for i in finished:
            self.reasons[self.live[i]] = "eos" if bool(is_eos[i]) else "length"
        return finished

    def finish(self, i: int) -> None:
        self.lengths[self.live[i]] = self.position

    def live_positions(self) -> list[int]:
        return [i for i, r in enumerate(self.live) if r not in self.lengths]

    def compact(self, keep: list[int]) -> None:
        self.live = [self.live[i] for i in keep]

    def last_tokens(self) -> torch.Tensor:
        return self.tokens[torch.tensor(self.live), self.position - 1].unsqueeze(1)

    def completions(self, proof_fn: ProofFn | None) -> list[CompletionResult]:
        """Assemble every row; proofs for the whole batch come from one vectorised build (its cost is per call,
        not per chunk, so one call per batch keeps proof building far below the decoding time)."""
        rows = range(len(self.rows))
        if self.hidden is not None and proof_fn is not None:
            proofs = proof_fn([self.hidden[r, : self.lengths[r]] for r in rows])
        else:
            proofs = [b""] * len(self.rows)
        return [CompletionResult(tokens=tuple(self.tokens[r, : self.lengths[r]].tolist()),
                                 logprobs=tuple(self.logprobs[r, : self.lengths[r]].tolist()),
                                 finish_reason=self.reasons[r], proof=proofs[r]) for r in rows]
