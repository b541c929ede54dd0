"""FastCuRL's curriculum as data: stages of (data segment, context length, group size, steps), advanced by step.

Why data and not code: FastCuRL (arXiv 2503.17287, docs/reference.md#fastcurl) is a schedule, short prompts at a short
context -> all prompts at a medium context -> long prompts at a long context -> all prompts at the medium context again,
and the stage in force fixes what the swarm generates (the data segment workers draw from and the generation settings
written into each published policy's generation.json). A pure `stage_at(step)` lets the trainer, validators and tests
agree on the stage without sharing any state. Custom schedules are TOML files of [[stage]] tables.

The built-in "fastcurl" schedule scales the paper's 8K/16K/24K/16K contexts to the configured max_new_tokens M as
M/2, M, 3M/2, M, with group sizes n, n, n, 2n (the paper's 8, 8, 8, 16) and the steps split in four equal parts.
"none" is one stage: all prompts at M with group size n.
"""

from __future__ import annotations

import tomllib
from dataclasses import asdict, dataclass
from pathlib import Path

from trainer.errors import TrainerError

SEGMENTS = ("short", "all", "long")
STAGE_KEYS = ("name", "data", "max_new_tokens", "group_size", "steps")
PRESETS = ("fastcurl", "none")


@dataclass(frozen=True)
class Stage:
    """One curriculum stage."""

    name: str  # shown in progress lines and written to generation.json
    data: str  # which prompts: "short" (below the mean prompt length), "all", or "long" (at or above it)
    max_new_tokens: int  # the context allowed for generation in this stage
    group_size: int  # completions per prompt
    steps: int  # optimizer steps spent in this stage (the last stage also runs past its end)

    def __post_init__(self) -> None:
        if self.data not in SEGMENTS:
            raise TrainerError(f"stage {self.name!r} has data {self.data!r}: choose from {', '.join(SEGMENTS)}")
        if self.max_new_tokens < 1 or self.group_size < 1 or self.steps < 1:
            raise TrainerError(f"stage {self.name!r} needs max_new_tokens, group_size and steps of at least 1")


@dataclass(frozen=True)
class StagePosition:
    """Where a step falls in the schedule."""

    index: int  # 0-based stage number
    stage: Stage
    step_in_stage: int  # steps already taken inside this stage


@dataclass(frozen=True)
class Curriculum:
    """An ordered list of stages; `stage_at(step)` is a pure function of the global optimizer step."""

    name: str
    stages: tuple[Stage, ...]

    def __post_init__(self) -> None:
        if not self.stages:
            raise TrainerError(f"curriculum {self.name!r} has no stages")

    @property
    def total_steps(self) -> int:
        return sum(s.steps for s in self.stages)

    def stage_at(self, step: int) -> StagePosition:
        """The stage in force for optimizer step `step` (0-based); past the end, the last stage continues."""
        start = 0
        for index, stage in enumerate(self.stages):
            if step < start + stage.steps:
                return StagePosition(index, stage, step - start)
            start += stage.steps
        last = len(self.stages) - 1
        return StagePosition(last, self.stages[last], step - (start - self.stages[last].steps))

    def generation_settings(self, step: int, temperature: float) -> dict:
        """What a policy published at `step` tells workers to do: the content of generation.json."""
        pos = self.stage_at(step)
        return {
            "group_size": pos.stage.group_size,
            "temperature": float(temperature),
            "max_new_tokens": pos.stage.max_new_tokens,
            "stage": pos.stage.name,
            "stage_index": pos.index,
            "data": pos.stage.data,
        }

    def to_dict(self) -> dict:
        return {"name": self.name, "stages": [asdict(s) for s in self.stages]}


def _split_steps(total: int, parts: int) -> list[int]:
    """Split `total` steps into `parts` positive counts differing by at most one (earlier parts get the extra)."""
    total = max(total, parts)
    base, extra = divmod(total, parts)
    return [base + (1 if i < extra else 0) for i in range(parts)]


def fastcurl(total_steps: int, max_new_tokens: int, group_size: int) -> Curriculum:
    """FastCuRL's four stages scaled to this run (see the module docstring)."""
    m = max_new_tokens
    contexts = [max(1, m // 2), m, max(1, (3 * m) // 2), m]
    segments = ["short", "all", "long", "all"]
    groups = [group_size, group_size, group_size, 2 * group_size]
    steps = _split_steps(total_steps, 4)
    stages = tuple(
        Stage(f"{seg}@{ctx}", seg, ctx, g, n) for seg, ctx, g, n in zip(segments, contexts, groups, steps)
    )
    return Curriculum("fastcurl", stages)


def no_curriculum(total_steps: int, max_new_tokens: int, group_size: int) -> Curriculum:
    """One stage over all prompts at the configured context."""
    return Curriculum("none", (Stage(f"all@{max_new_tokens}", "all", max_new_tokens, group_size, max(1, total_steps)),))


def curriculum_from_tables(name: str, tables: object) -> Curriculum:
    """Build a curriculum from parsed [[stage]] tables, rejecting unknown keys and stages without data."""
    if not isinstance(tables, list) or not tables:
        raise TrainerError(f"curriculum {name} needs at least one [[stage]] table")
    stages = []
    for i, table in enumerate(tables):
        if not isinstance(table, dict):
            raise TrainerError(f"curriculum {name}: stage {i + 1} is not a table")
        unknown = sorted(set(table) - set(STAGE_KEYS))
        if unknown:
            raise TrainerError(f"curriculum {name}: stage {i + 1} has unknown key {unknown[0]!r} "
                               f"(allowed: {', '.join(STAGE_KEYS)})")
        if "data" not in table:
            raise TrainerError(f"curriculum {name}: stage {i + 1} has no data (one of {', '.join(SEGMENTS)})")
        missing = [k for k in ("max_new_tokens", "group_size", "steps") if k not in table]
        if missing:
            raise TrainerError(f"curriculum {name}: stage {i + 1} is missing {missing[0]}")
        if not all(isinstance(table[k], int) and not isinstance(table[k], bool)
                   for k in ("max_new_tokens", "group_size", "steps")):
            raise TrainerError(f"curriculum {name}: stage {i + 1} needs whole numbers for tokens, group size, steps")
        label = str(table.get("name", f"{table['data']}@{table['max_new_tokens']}"))
        stages.append(Stage(label, str(table["data"]), table["max_new_tokens"], table["group_size"], table["steps"]))
    return Curriculum(name, tuple(stages))


def load_curriculum(spec: str, *, total_steps: int, max_new_tokens: int, group_size: int) -> Curriculum:
    """A preset name ("fastcurl", "none") or the path of a TOML file of [[stage]] tables."""
    if spec == "fastcurl":
        return fastcurl(total_steps, max_new_tokens, group_size)
    if spec == "none":
        return no_curriculum(total_steps, max_new_tokens, group_size)
    path = Path(spec)
    if not path.is_file():
        raise TrainerError(f"curriculum {spec!r} is neither a preset ({', '.join(PRESETS)}) nor a TOML file")
    try:
        raw = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as exc:
        raise TrainerError(f"curriculum file {spec} is not valid TOML: {exc}") from None
    extra = sorted(set(raw) - {"stage"})
    if extra:
        raise TrainerError(f"curriculum file {spec} has unknown key {extra[0]!r} (only [[stage]] tables)")
    return curriculum_from_tables(path.stem, raw.get("stage"))


def worst_case_tokens(curriculum: Curriculum, steps: int, prompts_per_step: int) -> int:
    """Generated tokens of `steps` steps if every completion ran to its stage's limit: prompts x group x context.

    Why an upper bound: a fair comparison of schedules fixes the budget of generated tokens (short stages are cheaper
    per step), and the bound is what a run can plan its stage lengths against before it has generated anything.
    """
    return sum(step_token_bound(curriculum, step, prompts_per_step) for step in range(steps))


def step_token_bound(curriculum: Curriculum, step: int, prompts_per_step: int) -> int:
    """The most tokens step `step` can generate: its stage's prompts x group size x context."""
    stage = curriculum.stage_at(step).stage
    return prompts_per_step * stage.group_size * stage.max_new_tokens


def steps_within_budget(spec: str, token_budget: int, *, max_new_tokens: int, group_size: int,
                        prompts_per_step: int) -> int:
    """The most steps a preset's schedule (stages split over those steps) can take within `token_budget` generated
    tokens at worst; at least 1. A longer schedule never costs fewer tokens, so the answer is a binary search."""
    def cost(steps: int) -> int:
        built = load_curriculum(spec, total_steps=steps, max_new_tokens=max_new_tokens, group_size=group_size)
        return worst_case_tokens(built, steps, prompts_per_step)

    low, high = 1, 2
    while cost(high) <= token_budget:
        low, high = high, high * 2
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (middle, high) if cost(middle) <= token_budget else (low, middle)
    return low

