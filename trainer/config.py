"""The trainer's one typed config: INTELLECT-2's recipe, scaled so that a run fits two CPU cores.

Why these defaults: the optimiser, clipping and loss settings are INTELLECT-2's final configuration
(docs/reference.md#grpo-recipe), while the sizes (batch, group, context, warm-up, steps per policy) are divided down so
a step takes seconds on a CPU. The task and learning rate are the ones the default model (tiny, random-init) learns
from within minutes; `swarm train` and `swarm sim` share them (trainer/configs/ holds the settings for SmolLM2).
A TOML file (top level or a [trainer] section, plus optional [[stage]] tables for a custom curriculum) sets any
field; the command line overrides the file (a field's own flag, or `--set trainer.FIELD=VALUE` for any field);
an unknown key or a value of the wrong type is one sentence naming the key and where it came from.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

from pydantic import Field, model_validator

from trainer.curriculum import Curriculum, curriculum_from_tables, load_curriculum
from trainer.errors import TrainerError
from trainer.loss_config import LossConfig
from trainer.tracking import parse_report_to
from trainer.typed_config import (
    ConfigPath,
    ConfigSection,
    Setting,
    build_sections,
    check_key,
    parse_assignment,
    read_toml,
    render_section,
    section_hint,
    toml_value,
)
from verify.reward_loading import RewardError, call_reward, load_reward

PARALLEL_MODES = ("ddp", "fsdp")
"""How data-parallel ranks split the trainer (TrainerConfig.parallel); trainer.distributed builds each."""


PUBLISH_DTYPES = ("bfloat16", "float32")


class TrainerConfig(ConfigSection):
    """Every setting of the RL loop, on one machine (`swarm train`) or as a swarm's trainer role."""

    model: str = Field("tiny", description=(
        "Model to start from: \"tiny\", \"smollm2\", a local directory (e.g. a published policy) or a Hugging Face "
        "hub id in the local Hugging Face cache (e.g. Qwen/Qwen2.5-0.5B-Instruct)."))
    task: str = Field("gcd", description=(
        "Task set: a built-in reasoning-gym name (`swarm tasks` lists them), a .jsonl/.json/.parquet/.csv file, "
        "or a hub dataset in the local Hugging Face cache (ORG/NAME for its train split, "
        "hf://datasets/ORG/NAME/PATH). gcd by default: a task the default tiny model learns (task_config sets its "
        "difficulty)."))
    reward: str = Field("", description=(
        "The run's own reward function, replacing every task's built-in scorer: module:function (an installed "
        "module) or path/to/file.py:function, in TRL's reward_funcs shape: fn(completions: list[str], **row_fields)"
        " -> list[float], the row's fields (prompt, answer, metadata, ...) as keyword lists; values are clamped to "
        "[0, 1]. The run spec carries its name and the BLAKE3 hash of its module's source: inference peers and "
        "validators need the same bytes under the same name (a relative path is read from each peer's working "
        "directory), and one without them refuses to vote on the run. Empty: each task's own scorer."))
    prompt_key: str = Field("prompt", description=(
        "Column of a task file or hub dataset holding the prompt (GSM8K: question)."))
    answer_key: str = Field("answer", description=(
        "Column holding the reference answer (a GSM8K answer \"... #### 72\" is read as 72)."))
    task_config: dict = Field(default_factory=dict, description=(
        "Difficulty overrides for a built-in task (reasoning-gym config fields, e.g. {max_value = 20})."))
    task_size: int = Field(512, description="How many prompts to generate for a built-in task set (train + held-out).")
    eval_fraction: float = Field(0.2, description="Share of the task set held out for evaluation; never trained on.")
    seed: int = Field(0, description=(
        "Seeds torch/python/numpy, the data split, the sampling keys and the prompt order."))
    run: str = Field("local", description="Run name, part of every sampling key.")
    steps: int = Field(40, description="Optimizer steps to train for (the curriculum's stages split these).")
    curriculum: str = Field("fastcurl", description=(
        "\"fastcurl\", \"none\" or a TOML file of [[stage]] tables (or put [[stage]] tables in this config file). "
        "FastCuRL by default: at one budget of generated tokens it reached a higher held-out accuracy than one "
        "fixed context (+0.065 paired, `swarm bench curriculum` on tiny-sum, 8 seeds per arm)."))
    lr: float = Field(1e-3, description=(
        "Peak AdamW learning rate. 1e-3 suits the default tiny random-init model (in `swarm sim` the last four "
        "steps' reward averaged 0.27 over eight sampling-noise draws, against 0.14 at 3e-3, which locked the "
        "policy onto one token in some runs); pretrained models want far less (trainer/configs/ uses 2e-5 for "
        "SmolLM2-135M; INTELLECT-2 used 3e-7 for 32B)."))
    weight_decay: float = Field(0.01, description="AdamW weight decay (INTELLECT-2).")
    beta1: float = Field(0.9, description="AdamW beta1 (INTELLECT-2).")
    beta2: float = Field(0.99, description="AdamW beta2 (INTELLECT-2).")
    warmup_steps: int = Field(2, description="Linear warm-up steps, then constant (INTELLECT-2: 25 of thousands).")
    grad_clip: float = Field(0.1, description="Global gradient-norm clip (INTELLECT-2 needed an aggressive 0.1).")
    prompts_per_step: int = Field(8, description=(
        "Groups (prompts) per optimizer step; the batch is prompts_per_step x group_size rollouts (INTELLECT-2: "
        "512)."))
    group_size: int = Field(8, description=(
        "Completions per prompt (INTELLECT-2: 16; FastCuRL: 8, 16 in its last stage)."))
    generation_batch_rows: int = Field(128, description=(
        "Completions the local generator decodes together (its KV cache holds this many rows). On a CPU a decode "
        "step of the tiny model costs about the same for 64 rows as for 128 (per-token Python, not FLOPs), so one"
        " batch of a step's 8 x 16 rollouts generated 20 % faster than two batches of 64."))
    micro_batch: int = Field(16, description=(
        "Completions per forward/backward pass (gradient accumulation bounds memory)."))
    steps_per_policy: int = Field(2, description=(
        "Optimizer steps between two published policy versions (INTELLECT-2: 8)."))
    async_level: int = Field(0, description=(
        "Maximum policy-version lag of a rollout (INTELLECT-2: 2); 0 = synchronous generate-then-train."))
    temperature: float = Field(0.6, description=(
        "Sampling temperature (INTELLECT-2 and FastCuRL: 0.6); the loss uses the same temperature."))
    max_new_tokens: int = Field(64, description=(
        "Generation context of the middle FastCuRL stage (the \"none\" curriculum uses it throughout)."))
    clip_delta: float = Field(4.0, description="Ratio cap before the PPO clip (INTELLECT-2's two-sided clipping).")
    eps_low: float = Field(0.2, description="PPO clip below 1.")
    eps_high: float = Field(0.2, description="PPO clip above 1.")
    off_policy_loss: str = Field("coupled", description=(
        "How stale (async) rollouts enter the loss. \"coupled\" = INTELLECT-2's: the two-sided PPO clip of pi_theta"
        " / pi_behaviour. \"decoupled\" = the PPO clip bounds only this step's move (against the weights at the "
        "step's start) and staleness is an importance weight pi_start / pi_behaviour capped at clip_delta (Hilton"
        " et al.'s decoupled objective, used by AReaL for asynchronous RL; trainer.grpo.decoupled_policy_loss "
        "says why). Identical for on-policy (synchronous) rollouts."))
    entropy_coef: float = Field(0.001, description="Entropy bonus (INTELLECT-2's code).")
    kl_coef: float = Field(0.0, description=(
        "k3 KL to the initial policy (INTELLECT-2 removed it; FastCuRL used 0.001)."))
    filter_zero_advantage: bool = Field(True, description="Online filtering: drop groups whose rewards are all equal.")
    length_target: int = Field(0, description=(
        "When > 0, append \"Think for N tokens.\" and subtract length_penalty x |len - N| from the reward."))
    length_penalty: float = Field(0.0003, description="Length-control coefficient (INTELLECT-2).")
    checkpoint_every: int = Field(10, description="Steps between full checkpoints (and one at the end).")
    keep_last: int = Field(2, description=(
        "Full checkpoints kept on disk, newest first; older ones are deleted after each new one is written."))
    resume: bool = Field(False, description=(
        "Continue the run in `out` even when it was started with another model, task or config (without it, such "
        "an `out` is refused; a run of the same config resumes either way, from its newest valid checkpoint)."))
    resume_from: str = Field("", description=(
        "A checkpoint directory (out/checkpoints/step-NNNNNN) to resume from instead of the newest valid one; "
        "it must verify, whatever run it belongs to."))
    time_limit_min: float = Field(0.0, description=(
        "Stop stepping once this many minutes have passed since the session started (0 = only `steps` stops it); "
        "the final policy, checkpoint and evaluation still follow. Why: learning is compared at a wall-time "
        "budget (\"after at most 30 minutes\"), and a step count cannot promise one on a machine of unknown speed."))
    eval_every: int = Field(0, description=(
        "Steps between held-out evaluations during training (0 = only before and after)."))
    eval_n: int = Field(64, description="Held-out prompts per evaluation (greedy).")
    threads: int = Field(1, description=(
        "torch intra-op threads (0 = torch's default). 1 by default: on a small, shared CPU box extra intra-op "
        "threads spin-wait against other processes (measured 25x slower steps on a loaded 2-core machine)."))
    old_logprobs: str = Field("recompute", description=(
        "Where the old-policy logprobs of off-policy rollouts come from: \"recompute\" = the trainer's own no-grad "
        "forward of the generating version (INTELLECT-2's trainer; the default); \"generator\" = the sampling "
        "logprobs the generating policy recorded (the same numbers on one machine's float32 kernels, and free: no"
        " extra forward, no weight snapshots), used only for rollouts of a trusted source, the local generator. "
        "The swarm's trainer always recomputes: its workers are untrusted and validators only bound their claimed"
        " logprobs (logprob_atol)."))
    publish_dtype: str = Field("bfloat16", description=(
        "dtype of the published policy, what workers load: \"bfloat16\" (the inference dtype; each version after "
        "the first then travels as a patch of the elements whose bf16 bytes changed) or \"float32\". The trainer "
        "keeps float32 master weights and optimizer state either way, and computes old logprobs with the "
        "published weights, the ones the workers sampled with."))
    generator: str = Field("process", description=(
        "Where the async generator runs (async_level > 0): \"process\" = its own OS process with its own torch "
        "threads, as a swarm inference peer (fastest: the sampler's per-token Python does not compete with "
        "training for the GIL); \"thread\" = a worker thread of the trainer's process (the simpler design, kept for"
        " comparison)."))
    generator_threads: int = Field(1, description=(
        "torch intra-op threads of the generator process. With `threads` (the trainer's) this splits the cores in"
        " async mode: 1 + 1 on a 2-core box. Sync mode runs generation and training in one process on `threads`."))
    generator_prefetch: int = Field(0, description=(
        "Batches the trainer asks the generator process for ahead of the one it trains (0 = async_level, the most"
        " the window allows). 1 keeps a generator that is slower than the trainer busy while bounding the lag to "
        "one version; more only buffers the trainer against hiccups (evaluations, checkpoints) at the price of "
        "staler rollouts."))
    generator_own_session: bool = Field(False, description=(
        "Start the generator process in its own OS session. Linux's autogroup scheduler shares a busy CPU fairly "
        "between sessions, not processes, so on a saturated shared box the two processes of one session split one"
        " share and async cannot beat sync; in its own session the generator gets a share of its own, as a "
        "separate inference peer would. Off by default: it takes CPU from other users of a shared machine (no "
        "effect on an idle or dedicated one)."))
    generator_timeout_s: float = Field(600.0, description=(
        "Longest wait for one batch from the generator process before the trainer stops with an error (never a "
        "hang)."))
    parallel: str = Field("ddp", description=(
        "How `swarm train --nproc N` splits the trainer over ranks: \"ddp\" = every rank holds the whole model and "
        "the gradients are all-reduced; \"fsdp\" = weights, gradients and AdamW state are sharded across the ranks "
        "(FSDP2, trainer.fsdp), for a model whose training state does not fit one device. Both take the same "
        "steps as one process; \"fsdp\" needs at least two ranks."))
    device: str = Field("auto", description=(
        "Where a one-process `swarm train` trains, generates and evaluates: auto (a CUDA GPU when torch sees one,"
        " else the CPU), cpu or cuda. Its generator process (async) stays on the CPU. With --nproc the parallel "
        "mode decides (ddp: the CPU; fsdp: each rank's GPU under nccl). The swarm trainer role takes `swarm peer "
        "start --device`."))
    out: ConfigPath = Field(Path("runs/train"), description=(
        "Output directory: checkpoints/, policies/, final/, log.jsonl, reward.png."))
    report_to: str = Field("none", description=(
        'Experiment trackers fed every step\'s figures (trainer.tracking): "none", "tensorboard", "wandb" or both, '
        "comma-separated. Their files go under `out` (tensorboard/, wandb/); W&B runs offline unless wandb_mode or "
        "WANDB_MODE says online."))
    wandb_project: str = Field("", description=(
        "W&B project of the run (report_to = \"wandb\"); empty: WANDB_PROJECT, else rl-swarm."))
    wandb_name: str = Field("", description="W&B run name; empty: the run's name (`run`).")
    wandb_tags: list[str] = Field(default_factory=list, description="W&B tags of the run, e.g. [\"gcd\", \"tiny\"].")
    wandb_mode: str = Field("", description=(
        "\"online\" (W&B's servers; log in with `wandb login` or WANDB_API_KEY) or \"offline\" (files under "
        "`out`/wandb, `wandb sync` uploads them later); empty: WANDB_MODE, else offline. A restart with the same "
        "`out` resumes the same W&B run: its id is kept in `out`/wandb/run-id."))

    @model_validator(mode="after")
    def _check_ranges(self) -> "TrainerConfig":
        positive = ("task_size", "steps", "prompts_per_step", "group_size", "micro_batch", "generation_batch_rows",
                    "steps_per_policy", "max_new_tokens", "checkpoint_every", "eval_n", "keep_last")
        for name in positive:
            if getattr(self, name) < 1:
                raise TrainerError(f"{name} must be at least 1, got {getattr(self, name)}")
        if not self.time_limit_min >= 0:
            raise TrainerError(f"time_limit_min must not be negative, got {self.time_limit_min}")
        if self.async_level < 0:
            raise TrainerError("async_level must not be negative")
        if self.publish_dtype not in PUBLISH_DTYPES:
            raise TrainerError(f"publish_dtype must be one of {', '.join(PUBLISH_DTYPES)}, got {self.publish_dtype!r}")
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
        parse_report_to(self.report_to)
        if self.wandb_mode not in ("", "online", "offline"):
            raise TrainerError(f"wandb_mode must be online, offline or empty, got {self.wandb_mode!r}")
        if self.reward:
            try:
                load_reward(self.reward)
            except RewardError as exc:
                raise TrainerError(str(exc)) from None
        return self

    def loss_config(self) -> LossConfig:
        return LossConfig(self.clip_delta, self.eps_low, self.eps_high, self.entropy_coef, self.kl_coef,
                          decoupled=self.off_policy_loss == "decoupled")


def apply_reward(cfg: TrainerConfig, tasks):
    """`tasks` scored by the config's own reward (unchanged without one), which is first tried on one prompt so a
    reward that answers in the wrong shape stops the run at its start with one sentence, not after hours of zeros."""
    if not cfg.reward or len(tasks) == 0:
        return tasks
    loaded = load_reward(cfg.reward)
    try:
        call_reward(loaded.fn, loaded.name, ["", "0"], next(iter(tasks)).to_dict())
    except RewardError as exc:
        raise TrainerError(str(exc)) from None
    except Exception as exc:  # noqa: BLE001 - the user's code: its failure in one line, never a traceback
        raise TrainerError(f"reward {cfg.reward} failed on a sample prompt: {type(exc).__name__}: {exc}") from None
    return tasks.with_reward(cfg.reward)


@dataclass(frozen=True)
class LoadedConfig:
    """A validated config and the curriculum it implies."""

    config: TrainerConfig
    curriculum: Curriculum
    inline_stages: bool = False
    """The curriculum is the config file's own [[stage]] tables (not a preset or a file it names)."""


SECTIONS = {"trainer": TrainerConfig}
"""The trainer config's one section: its dotted keys are `trainer.FIELD` (`--set trainer.lr=1e-4`)."""


def _read_file(path: Path) -> tuple[dict, object]:
    """(settings, [[stage]] tables or None) of a trainer TOML file: a [trainer] table or top-level keys."""
    raw = read_toml(path, TrainerError)
    stages = raw.pop("stage", None)
    values = raw.pop("trainer", None)
    if values is None:
        values = raw
        fields = TrainerConfig.model_fields
        tables = [key for key, value in raw.items() if isinstance(value, dict) and key not in fields]
        if tables:
            raise TrainerError(f"config file {path} has unknown section {tables[0]!r}"
                               f"{section_hint(tables[0], ['trainer', 'stage'])}")
    elif raw:
        name = sorted(raw)[0]
        raise TrainerError(f"config file {path} has unknown section {name!r} beside [trainer]"
                           f"{section_hint(name, ['trainer', 'stage'])}")
    if not isinstance(values, dict):
        raise TrainerError(f"config file {path}: trainer must be a table")
    return values, stages


def file_settings(path: Path | None) -> tuple[list[Setting], object]:
    if path is None:
        return [], None
    values, stages = _read_file(path)
    origin = f"config file {path}"
    settings = [(f"trainer.{key}", value, origin) for key, value in values.items()]
    for key, _, _ in settings:
        check_key(key, SECTIONS, origin, TrainerError)
    return settings, stages


def load_config(path: Path | None = None, overrides: dict | None = None, sets: list[str] | tuple = ()) -> LoadedConfig:
    """The TOML file (optional), then the non-None `overrides` (fields by name: the command's flags), then each
    `--set trainer.FIELD=VALUE` of `sets`; every value checked against its field's type, the result validated."""
    settings, stages = file_settings(path)
    given = {key: value for key, value in (overrides or {}).items() if value is not None}
    settings += [(f"trainer.{key}", value, "the command line") for key, value in given.items()]
    for text in sets:
        key, value, origin = parse_assignment(text, SECTIONS, TrainerError)
        if key.split(".", 1)[1] in given:
            raise TrainerError(f"{key} is given twice, by its own flag and by --set: give it once")
        settings.append((key, value, origin))
    config = build_sections(SECTIONS, settings, TrainerError)["trainer"]
    if stages is not None:
        curriculum = curriculum_from_tables(Path(path).stem, stages)
    else:
        curriculum = load_curriculum(config.curriculum, total_steps=config.steps,
                                     max_new_tokens=config.max_new_tokens, group_size=config.group_size)
    return LoadedConfig(config, curriculum, stages is not None)


def render_toml(loaded: LoadedConfig) -> str:
    """The effective config as a TOML file that loads back to the same config: [trainer] with every field
    described, then the [[stage]] tables when the curriculum came from this config's own tables."""
    text = render_section("trainer", loaded.config)
    if loaded.inline_stages:
        for stage in loaded.curriculum.stages:
            text += "\n[[stage]]\n" + "".join(f"{key} = {toml_value(value)}\n"
                                               for key, value in asdict(stage).items())
    return text
