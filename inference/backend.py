"""The generation-backend interface: what an inference peer asks for and what it gets back.

Why an interface: the torch backend (CPU, tests, small models) and the vLLM backend (GPU workers) must be
interchangeable under the same conformance suite; both sample with verify.sampling's seeded Gumbel-max so a
validator can re-derive every token, and both return TOPLOC proofs of the hidden states that produced them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from verify.sampling import SamplingKey

BASE_MANIFEST_ID = bytes(32)  # the "manifest id" of a base model that no trainer has published


@dataclass(frozen=True)
class GenerationRequest:
    """One prompt to complete n = len(keys) times.

    prompt_tokens: the chat-formatted prompt; keys: one SamplingKey per completion (fixes its Gumbel noise);
    temperature: softmax temperature (0 = greedy); max_new_tokens: the stage's limit per completion (>= 1).
    """

    prompt_tokens: tuple[int, ...]
    keys: tuple[SamplingKey, ...]
    temperature: float
    max_new_tokens: int

    def __post_init__(self) -> None:
        if not self.prompt_tokens:
            raise ValueError("a request needs a non-empty prompt")
        if not self.keys:
            raise ValueError("a request needs at least one sampling key")
        if self.max_new_tokens < 1:
            raise ValueError("max_new_tokens must be >= 1")
        if not 0.0 <= self.temperature <= 10.0:
            raise ValueError(f"temperature {self.temperature} is out of range [0, 10]")


@dataclass(frozen=True)
class CompletionResult:
    """One completion: generated ids (EOS included when it ended on EOS), the sampling logprob of each under
    softmax(logits / T), why it stopped ("eos" | "length") and the TOPLOC proof of its hidden states
    (b"" when proof capture is off)."""

    tokens: tuple[int, ...]
    logprobs: tuple[float, ...]
    finish_reason: str
    proof: bytes


@dataclass(frozen=True)
class GroupResult:
    """The completions of one request, in key order, with the policy that generated them."""

    request: GenerationRequest
    completions: tuple[CompletionResult, ...]
    policy_version: int
    manifest_id: bytes


class GenerationBackend(Protocol):
    """What every backend implements.

    Proof hidden states: hidden[i] is the input of the LM head at the forward step whose logits produced
    generated token i, i.e. position len(prompt) - 1 + i when prompt + completion is prefilled in one pass.
    """

    policy_version: int
    manifest_id: bytes

    def generate(self, requests: Sequence[GenerationRequest]) -> list[GroupResult]:
        """Complete every request; results are in request order."""
        ...

    def load_policy(self, directory: str, *, version: int, manifest_id: bytes,
                    changed: frozenset[str] | None = None) -> None:
        """Swap in the weights of a published policy directory (safetensors files) without rebuilding the model;
        `changed`: only these tensors, the rest being those of the version loaded now (None: all of them)."""
        ...
