"""The trainer's one typed config: INTELLECT-2's recipe, scaled so that a run fits two CPU cores.

Why these defaults: the optimiser, clipping and loss settings are INTELLECT-2's final configuration
(docs/reference.md#grpo-recipe), while the sizes (batch, group, context, warm-up, steps per policy) are divided down so
a step takes seconds on a CPU, and the learning rate is raised because the models here are 4-5 orders of magnitude
smaller than QwQ-32B. A TOML file (top level or a [trainer] section, plus optional [[stage]] tables for a custom
curriculum) sets any field; CLI flags override the file; unknown keys are rejected in one line.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field, fields, replace
from pathlib import Path

from trainer.curriculum import Curriculum, curriculum_from_tables, load_curriculum
from trainer.errors import TrainerError
from trainer.loss_config import LossConfig

PARALLEL_MODES = ("ddp", "fsdp")
"""How data-parallel ranks split the trainer (TrainerConfig.parallel); trainer.distributed builds each."""


@dataclass(frozen=True)
class TrainerConfig:
    model: str = "tiny"
    """Model to start from: "tiny", "smollm2", a local directory (e.g. a published policy) or a Hugging Face hub id
    in the local Hugging Face cache (e.g. Qwen/Qwen2.5-0.5B-Instruct)."""
    task: str = "basic_arithmetic"
    """Task set: a built-in reasoning-gym name (`swarm tasks` lists them), a .jsonl/.json/.parquet/.csv file, or a
    hub dataset in the local Hugging Face cache (ORG/NAME for its train split, hf://datasets/ORG/NAME/PATH)."""
    prompt_key: str = "prompt"
    """Column of a task file or hub dataset holding the prompt (GSM8K: question)."""
    answer_key: str = "answer"
    """Column holding the reference answer (a GSM8K answer "... #### 72" is read as 72)."""
    task_config: dict = field(default_factory=dict)
    """Difficulty overrides for a built-in task (reasoning-gym config fields, e.g. {max_value = 20})."""
    task_size: int = 512
    """How many prompts to generate for a built-in task set (train + held-out)."""
    eval_fraction: float = 0.2
    """Share of the task set held out for evaluation; never trained on."""
    seed: int = 0
    """Seeds torch/python/numpy, the data split, the sampling keys and the prompt order."""
    run: str = "local"
    """Run name, part of every sampling key."""
    steps: int = 40
    """Optimizer steps to train for (the curriculum's stages split these)."""
    curriculum: str = "none"
    """"fastcurl", "none" or a TOML file of [[stage]] tables (or put [[stage]] tables in this config file)."""
    lr: float = 1e-5
    """Peak AdamW learning rate (INTELLECT-2: 3e-7 for 32B; raised for small models)."""
    weight_decay: float = 0.01
    """AdamW weight decay (INTELLECT-2)."""
    beta1: float = 0.9
    """AdamW beta1 (INTELLECT-2)."""
    beta2: float = 0.99
    """AdamW beta2 (INTELLECT-2)."""
    warmup_steps: int = 2
    """Linear warm-up steps, then constant (INTELLECT-2: 25 of thousands)."""
    grad_clip: float = 0.1
    """Global gradient-norm clip (INTELLECT-2 needed an aggressive 0.1)."""
    prompts_per_step: int = 8
    """Groups (prompts) per optimizer step; the batch is prompts_per_step x group_size rollouts (INTELLECT-2: 512)."""
    group_size: int = 8
    """Completions per prompt (INTELLECT-2: 16; FastCuRL: 8, 16 in its last stage)."""
    generation_batch_rows: int = 128
    """Completions the local generator decodes together (its KV cache holds this many rows). On a CPU a decode
    step of the tiny model costs about the same for 64 rows as for 128 (per-token Python, not FLOPs), so one batch
    of a step's 8 x 16 rollouts generated 20 % faster than two batches of 64."""
    micro_batch: int = 16
    """Completions per forward/backward pass (gradient accumulation bounds memory)."""
    steps_per_policy: int = 2
    """Optimizer steps between two published policy versions (INTELLECT-2: 8)."""
    async_level: int = 0
    """Maximum policy-version lag of a rollout (INTELLECT-2: 2); 0 = synchronous generate-then-train."""
    temperature: float = 0.6
    """Sampling temperature (INTELLECT-2 and FastCuRL: 0.6); the loss uses the same temperature."""
    max_new_tokens: int = 64
    """Generation context of the middle FastCuRL stage (the "none" curriculum uses it throughout)."""
    clip_delta: float = 4.0
    """Ratio cap before the PPO clip (INTELLECT-2's two-sided clipping)."""
    eps_low: float = 0.2
    """PPO clip below 1."""
    eps_high: float = 0.2
    """PPO clip above 1."""
    off_policy_loss: str = "coupled"
    """How stale (async) rollouts enter the loss. "coupled" = INTELLECT-2's: the two-sided PPO clip of
    pi_theta / pi_behaviour. "decoupled" = the PPO clip bounds only this step's move (against the weights at the
    step's start) and staleness is an importance weight pi_start / pi_behaviour capped at clip_delta (Hilton et
    al.'s decoupled objective, used by AReaL for asynchronous RL; trainer.grpo.decoupled_policy_loss says why).
    Identical for on-policy (synchronous) rollouts."""
    entropy_coef: float = 0.001
    """Entropy bonus (INTELLECT-2's code)."""
    kl_coef: float = 0.0
    """k3 KL to the initial policy (INTELLECT-2 removed it; FastCuRL used 0.001)."""
    filter_zero_advantage: bool = True
    """Online filtering: drop groups whose rewards are all equal."""
    length_target: int = 0
    """When > 0, append "Think for N tokens." and subtract length_penalty x |len - N| from the reward."""
    length_penalty: float = 0.0003
    """Length-control coefficient (INTELLECT-2)."""
    checkpoint_every: int = 10
    """Steps between full checkpoints (and one at the end)."""
    time_limit_min: float = 0.0
    """Stop stepping once this many minutes have passed since the session started (0 = only `steps` stops it);
    the final policy, checkpoint and evaluation still follow. Why: learning is compared at a wall-time budget
    ("after at most 30 minutes"), and a step count cannot promise one on a machine of unknown speed."""
    eval_every: int = 0
    """Steps between held-out evaluations during training (0 = only before and after)."""
    eval_n: int = 64
    """Held-out prompts per evaluation (greedy)."""
    threads: int = 1
    """torch intra-op threads (0 = torch's default). 1 by default: on a small, shared CPU box extra intra-op
    threads spin-wait against other processes (measured 25x slower steps on a loaded 2-core machine)."""
    old_logprobs: str = "recompute"
    """Where the old-policy logprobs of off-policy rollouts come from: "recompute" = the trainer's own no-grad
    forward of the generating version (INTELLECT-2's trainer; the default); "generator" = the sampling logprobs the
    generating policy recorded (the same numbers on one machine's float32 kernels, and free: no extra forward, no
    weight snapshots), used only for rollouts of a trusted source, the local generator. The swarm's trainer always
    recomputes: its workers are untrusted and validators only bound their claimed logprobs (logprob_atol)."""
    generator: str = "process"
    """Where the async generator runs (async_level > 0): "process" = its own OS process with its own torch threads,
    as a swarm inference peer (fastest: the sampler's per-token Python does not compete with training for the
    GIL); "thread" = a worker thread of the trainer's process (the simpler design, kept for comparison)."""
    generator_threads: int = 1
    """torch intra-op threads of the generator process. With `threads` (the trainer's) this splits the cores in
    async mode: 1 + 1 on a 2-core box. Sync mode runs generation and training in one process on `threads`."""
    generator_prefetch: int = 0
    """Batches the trainer asks the generator process for ahead of the one it trains (0 = async_level, the most the
    window allows). 1 keeps a generator that is slower than the trainer busy while bounding the lag to one version;
    more only buffers the trainer against hiccups (evaluations, checkpoints) at the price of staler rollouts."""
    generator_own_session: bool = False
    """Start the generator process in its own OS session. Linux's autogroup scheduler shares a busy CPU fairly
    between sessions, not processes, so on a saturated shared box the two processes of one session split one
    share and async cannot beat sync; in its own session the generator gets a share of its own, as a separate
    inference peer would. Off by default: it takes CPU from other users of a shared machine (no effect on an
    idle or dedicated one)."""
    generator_timeout_s: float = 600.0
    """Longest wait for one batch from the generator process before the trainer stops with an error (never a hang)."""
    parallel: str = "ddp"
    """How `swarm train --nproc N` splits the trainer over ranks: "ddp" = every rank holds the whole model and the
    gradients are all-reduced; "fsdp" = weights, gradients and AdamW state are sharded across the ranks (FSDP2,
    trainer.fsdp), for a model whose training state does not fit one device. Both take the same steps as one
    process; "fsdp" needs at least two ranks."""
    device: str = "auto"
    """Where a one-process `swarm train` trains, generates and evaluates: auto (a CUDA GPU when torch sees one, else
    the CPU), cpu or cuda. Its generator process (async) stays on the CPU. With --nproc the parallel mode decides
    (ddp: the CPU; fsdp: each rank's GPU under nccl). The swarm trainer role takes `swarm peer start --device`."""
    out: Path = Path("runs/train")
    """Output directory: checkpoints/, policies/, final/, log.jsonl, reward.png."""

    def validate(self) -> "TrainerConfig":
        positive = ("task_size", "steps", "prompts_per_step", "group_size", "micro_batch", "generation_batch_rows",
                    "steps_per_policy", "max_new_tokens", "checkpoint_every", "eval_n")
        for name in positive:
            if getattr(self, name) < 1:
                raise TrainerError(f"{name} must be at least 1, got {getattr(self, name)}")
        if not self.time_limit_min >= 0:
            raise TrainerError(f"time_limit_min must not be negative, got {self.time_limit_min}")
        if self.async_level < 0:
            raise TrainerError("async_level must not be negative")
        if self.old_logprobs not in ("generator", "recompute"):
            raise TrainerError(f"old_logprobs must be 'generator' or 'recompute', got {self.old_logprobs!r}")
        if self.off_policy_loss not in ("coupled", "decoupled"):
            raise TrainerError(f"off_policy_loss must be 'coupled' or 'decoupled', got {self.off_policy_loss!r}")
        if self.parallel not in PARALLEL_MODES:
            raise TrainerError(f"parallel must be one of {', '.join(PARALLEL_MODES)}, got {self.parallel!r}")
        if self.device not in ("auto", "cpu", "cuda"):
            raise TrainerError(f"device must be auto, cpu or cuda, got {self.device!r}")
        if self.generator not in ("process", "thread"):
            raise TrainerError(f"generator must be 'process' or 'thread', got {self.generator!r}")
        if not 0 <= self.generator_prefetch <= max(1, self.async_level):
            raise TrainerError(
                f"generator_prefetch must be between 0 and the async level, got {self.generator_prefetch}")
        if self.generator_threads < 1 or self.generator_timeout_s <= 0:
            raise TrainerError("generator_threads must be at least 1 and generator_timeout_s positive")
        if not 0.0 < self.eval_fraction < 1.0:
            raise TrainerError(f"eval_fraction must be between 0 and 1, got {self.eval_fraction}")
        if self.lr <= 0 or self.grad_clip <= 0 or self.temperature < 0:
            raise TrainerError("lr and grad_clip must be positive and temperature non-negative")
        if not (0 <= self.eps_low < 1 and self.eps_high >= 0 and self.clip_delta > 1 + self.eps_high):
            raise TrainerError("clipping needs 0 <= eps_low < 1, eps_high >= 0 and clip_delta > 1 + eps_high")
        return self

    def loss_config(self) -> LossConfig:
        return LossConfig(self.clip_delta, self.eps_low, self.eps_high, self.entropy_coef, self.kl_coef,
                          decoupled=self.off_policy_loss == "decoupled")


@dataclass(frozen=True)
class LoadedConfig:
    """A validated config and the curriculum it implies."""

    config: TrainerConfig
    curriculum: Curriculum


def _coerce(name: str, value: object, default: object) -> object:
    """Check a TOML/CLI value against the field's default type (ints accepted for floats, strings for paths)."""
    if isinstance(default, Path):
        if not isinstance(value, (str, Path)):
            raise TrainerError(f"config key {name} must be a path string")
        return Path(value)
    if isinstance(default, bool):
        if not isinstance(value, bool):
            raise TrainerError(f"config key {name} must be true or false")
        return value
    if isinstance(default, float) and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if type(value) is not type(default):
        raise TrainerError(f"config key {name} must be a {type(default).__name__}, got {value!r}")
    return value


def _read_toml(path: Path) -> tuple[dict, object]:
    try:
        raw = tomllib.loads(Path(path).read_text())
    except FileNotFoundError:
        raise TrainerError(f"config file {path} does not exist") from None
    except tomllib.TOMLDecodeError as exc:
        raise TrainerError(f"config file {path} is not valid TOML: {exc}") from None
    stages = raw.pop("stage", None)
    values = raw.pop("trainer", None)
    if values is None:
        values = raw
    elif raw:
        raise TrainerError(f"config file {path} has unknown section {sorted(raw)[0]!r} beside [trainer]")
    return values, stages


def load_config(path: Path | None = None, overrides: dict | None = None) -> LoadedConfig:
    """TOML file (optional) then non-None overrides, each checked against the field types; validated."""
    values, stages = _read_toml(path) if path is not None else ({}, None)
    values = {**values, **{k: v for k, v in (overrides or {}).items() if v is not None}}
    defaults = TrainerConfig()
    known = {f.name for f in fields(TrainerConfig)}
    unknown = sorted(set(values) - known)
    if unknown:
        raise TrainerError(f"unknown trainer config key {unknown[0]!r} (known: {', '.join(sorted(known))})")
    coerced = {k: _coerce(k, v, getattr(defaults, k)) for k, v in values.items()}
    config = replace(defaults, **coerced).validate()
    if stages is not None:
        curriculum = curriculum_from_tables(Path(path).stem, stages)
    else:
        curriculum = load_curriculum(config.curriculum, total_steps=config.steps,
                                     max_new_tokens=config.max_new_tokens, group_size=config.group_size)
    return LoadedConfig(config, curriculum)
