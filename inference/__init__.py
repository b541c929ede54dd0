"""inference: loading policy models, generation backends (torch on CPU, vLLM on GPU) with seeded Gumbel-max
sampling and TOPLOC proofs, in-place policy hot-swap, rollout building and solve-rate estimation.

Never imports p2p: it takes and returns plain data (token ids, tensors, bytes, verify.rollout objects).
"""

from inference.backend import BASE_MANIFEST_ID, CompletionResult, GenerationBackend, GenerationRequest, GroupResult
from inference.errors import InferenceError
from inference.models import LoadedModel, default_cache_dir, load_model
from inference.rollouts import build_rollout_group, make_request, sampling_keys
from inference.solve_rate import solve_rate_estimator
from inference.torch_backend import TorchBackend

__all__ = [
    "BASE_MANIFEST_ID", "CompletionResult", "GenerationBackend", "GenerationRequest", "GroupResult", "InferenceError",
    "LoadedModel", "TorchBackend", "build_rollout_group", "default_cache_dir", "load_model", "make_request",
    "sampling_keys", "solve_rate_estimator",
]
