"""Backend conformance: every GenerationBackend (torch always; vLLM where it imports) must pass the same checks."""

import dataclasses
import importlib.util
import math

import pytest
import torch
from safetensors.torch import save_file

from inference.backend import BASE_MANIFEST_ID, GenerationRequest
from inference.errors import InferenceError
from inference.models import load_model
from inference.testing import prefill, requests_for
from inference.torch_backend import TorchBackend
from verify.sampling import SamplingKey, gumbel_noise, perturbed_scores
from verify.toploc import proof_size, verify_proof

pytestmark = pytest.mark.usefixtures("one_torch_thread")

BACKENDS = ["torch"] + (["vllm"] if importlib.util.find_spec("vllm") else [])
# Float tolerance between a backend's logprobs and the reference prefill (vLLM on GPU runs other kernels).
LOGPROB_TOL = {"torch": 1e-4, "vllm": 5e-2}


def make_backend(kind, loaded):
    if kind == "torch":
        return TorchBackend(loaded)
    from inference.vllm_backend import VllmBackend

    return VllmBackend(loaded, dtype="float32")  # the oracle below is a float32 transformers prefill


# vLLM's in-process engines share one process-wide parallel state, which the first engine to be destroyed tears
# down for all of them: a test's extra engines therefore live as long as the module's, never shorter.
_EXTRA_ENGINES: list = []


def extra_backend(kind, loaded):
    backend = make_backend(kind, loaded)
    _EXTRA_ENGINES.append(backend)
    return backend


def model_for(kind, cache_dir=None):
    """The tiny model, except under vLLM, whose attention kernels take heads of 32 or more dimensions (the tiny
    model's have 16; vLLM's CPU backend refuses them): there SmolLM2-135M, converted from the offline GGUF."""
    return load_model("smollm2" if kind == "vllm" else "tiny", cache_dir=cache_dir)


@pytest.fixture(scope="module", params=BACKENDS)
def backend(request, tiny):
    return make_backend(request.param, tiny if request.param == "torch" else model_for(request.param))


def kind_of(backend):
    return "torch" if isinstance(backend, TorchBackend) else "vllm"


def test_shapes_order_and_policy_stamp(backend):
    reqs = requests_for(backend.loaded, count=3, group=3, max_new_tokens=10)
    results = backend.generate(reqs)
    assert [r.request for r in results] == reqs
    for group in results:
        assert len(group.completions) == 3
        assert group.policy_version == 0 and group.manifest_id == BASE_MANIFEST_ID
        for c in group.completions:
            assert 1 <= len(c.tokens) <= 10 and len(c.logprobs) == len(c.tokens)
            assert c.finish_reason in ("eos", "length") and all(lp <= 1e-6 for lp in c.logprobs)


def test_same_keys_same_completions_other_keys_differ(backend):
    reqs = requests_for(backend.loaded, count=2, group=4, max_new_tokens=12)
    first, second = backend.generate(reqs), backend.generate(reqs)
    assert [[c.tokens for c in g.completions] for g in first] == [[c.tokens for c in g.completions] for g in second]
    texts = {c.tokens for g in first for c in g.completions}
    assert len(texts) >= 6  # 8 completions under 8 different keys are (almost all) distinct
    later = backend.generate(requests_for(backend.loaded, count=2, group=4, max_new_tokens=12, step=1))
    assert [c.tokens for c in later[0].completions] != [c.tokens for c in first[0].completions]


def test_batched_equals_alone(backend):
    reqs = requests_for(backend.loaded, count=4, group=3, max_new_tokens=16)
    together = backend.generate(reqs)
    for req, group in zip(reqs, together):
        alone = backend.generate([req])[0]
        for a, b in zip(alone.completions, group.completions):
            assert a.tokens == b.tokens and a.finish_reason == b.finish_reason
            assert max(abs(x - y) for x, y in zip(a.logprobs, b.logprobs)) < LOGPROB_TOL[kind_of(backend)]


def test_logprobs_and_tokens_match_a_separate_prefill(backend):
    """The oracle is one plain forward pass: it re-derives each sampled token (Gumbel-max) and its logprob."""
    model = backend.loaded.model
    temperature = 0.7
    for group in backend.generate(requests_for(backend.loaded, count=2, group=2, temperature=temperature,
                                               max_new_tokens=20)):
        for key, c in zip(group.request.keys, group.completions):
            logits, _ = prefill(model, group.request.prompt_tokens, c.tokens)
            expected = torch.log_softmax(logits.float() / temperature, dim=-1)
            for t, (tok, lp) in enumerate(zip(c.tokens, c.logprobs)):
                assert abs(expected[t, tok].item() - lp) < LOGPROB_TOL[kind_of(backend)]
                noise = gumbel_noise(key, t, logits.shape[-1])
                assert perturbed_scores(logits[t], noise, temperature).argmax().item() == tok


def test_greedy_is_argmax(backend):
    group = backend.generate(requests_for(backend.loaded, count=1, group=2, temperature=0.0, max_new_tokens=8))[0]
    a, b = group.completions
    assert a.tokens == b.tokens  # temperature 0 ignores the noise
    logits, _ = prefill(backend.loaded.model, group.request.prompt_tokens, a.tokens)
    assert list(a.tokens) == logits.argmax(dim=-1).tolist()


def test_max_tokens_and_eos(backend):
    loaded = backend.loaded  # the tiny model, or SmolLM2 under vLLM
    reqs = requests_for(loaded, count=2, group=3, max_new_tokens=9)
    for c in (c for g in backend.generate(reqs) for c in g.completions):  # the model's own EOS
        assert (c.finish_reason, len(c.tokens)) == ("length", 9) or (c.finish_reason == "eos" and
                                                                     c.tokens[-1] in loaded.eos_token_ids)
    never = loaded.model.config.vocab_size  # an id no logit row can produce: nothing stops before the limit
    plain = extra_backend(kind_of(backend), dataclasses.replace(loaded, eos_token_ids=(never,))).generate(reqs)
    for c in (c for g in plain for c in g.completions):
        assert c.finish_reason == "length" and len(c.tokens) == 9
    # Declare a token the model does produce mid-completion to be EOS: it must stop right there.
    stop = plain[0].completions[0].tokens[4]
    eos_backend = extra_backend(kind_of(backend), dataclasses.replace(loaded, eos_token_ids=(stop,)))
    stopped = eos_backend.generate(reqs)
    for before, after in zip((c for g in plain for c in g.completions), (c for g in stopped for c in g.completions)):
        if stop in before.tokens:
            cut = before.tokens.index(stop) + 1
            assert after.finish_reason == "eos" and after.tokens == before.tokens[:cut]
        else:
            assert after.finish_reason == "length" and after.tokens == before.tokens
    assert stopped[0].completions[0].finish_reason == "eos" and len(stopped[0].completions[0].tokens) <= 5


def test_proofs_cover_every_token_and_verify_against_prefill(backend):
    reqs = requests_for(backend.loaded, count=2, group=2, max_new_tokens=40)
    for group in backend.generate(reqs):
        for c in group.completions:
            assert len(c.proof) == proof_size(len(c.tokens)) == 258 * math.ceil(len(c.tokens) / 32)
            _, hidden = prefill(backend.loaded.model, group.request.prompt_tokens, c.tokens)
            result = verify_proof(c.proof, hidden)
            assert result.ok, result.reason
            other = verify_proof(c.proof, torch.roll(hidden, 1, dims=0))
            assert not other.ok  # the proof is bound to these hidden states, not any others


def _policy_dir(path, model, scale):
    path.mkdir()
    save_file({n: (p.detach() * scale).contiguous() for n, p in model.named_parameters()},
              str(path / "model.safetensors"))
    return str(path)


def test_weight_swap_changes_outputs_and_swapping_back_restores(tmp_path, tiny):
    for kind in BACKENDS:
        loaded = model_for(kind, cache_dir=tmp_path / f"own-{kind}")  # its own weights: the swaps mutate them
        backend = make_backend(kind, loaded)
        reqs = requests_for(loaded, count=2, group=2, max_new_tokens=12)
        before = backend.generate(reqs)
        original = _policy_dir(tmp_path / f"{kind}-v0", loaded.model, 1.0)
        changed = _policy_dir(tmp_path / f"{kind}-v1", loaded.model, 1.5)
        backend.load_policy(changed, version=1, manifest_id=b"\x01" * 32)
        after = backend.generate(reqs)
        assert after[0].policy_version == 1 and after[0].manifest_id == b"\x01" * 32
        assert [c.tokens for g in after for c in g.completions] != [c.tokens for g in before for c in g.completions]
        backend.load_policy(original, version=2, manifest_id=b"\x02" * 32)
        restored = backend.generate(reqs)
        assert [c.tokens for g in restored for c in g.completions] == [c.tokens for g in before for c in g.completions]


def test_a_policy_that_does_not_fit_is_rejected_whole(tmp_path, tiny):
    loaded = load_model("tiny", cache_dir=tmp_path / "own")
    backend = TorchBackend(loaded)
    reqs = requests_for(loaded, count=1, group=1, max_new_tokens=8)
    before = backend.generate(reqs)[0].completions[0].tokens
    bad = tmp_path / "bad"
    bad.mkdir()
    tensors = {n: p.detach().clone() * 2 for n, p in loaded.model.named_parameters()}
    tensors["model.norm.weight"] = torch.ones(3)
    save_file(tensors, str(bad / "model.safetensors"))
    with pytest.raises(InferenceError, match="model.norm.weight.*has shape"):
        backend.load_policy(str(bad), version=1, manifest_id=b"\x01" * 32)
    with pytest.raises(InferenceError, match="holds no .safetensors"):
        backend.load_policy(str(tmp_path), version=1, manifest_id=b"\x01" * 32)
    assert backend.generate(reqs)[0].completions[0].tokens == before and backend.policy_version == 0


def test_requests_are_validated():
    key = SamplingKey("r", "w", 0, 0, 0)
    with pytest.raises(ValueError, match="max_new_tokens"):
        GenerationRequest(prompt_tokens=(1, 2), keys=(key,), temperature=1.0, max_new_tokens=0)
    with pytest.raises(ValueError, match="at least one sampling key"):
        GenerationRequest(prompt_tokens=(1, 2), keys=(), temperature=1.0, max_new_tokens=4)
    with pytest.raises(ValueError, match="non-empty prompt"):
        GenerationRequest(prompt_tokens=(), keys=(key,), temperature=1.0, max_new_tokens=4)
