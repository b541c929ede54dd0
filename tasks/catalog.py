"""The catalogue of built-in tasks: each reasoning-gym dataset's name, one-line description and difficulty settings.

Why read them from reasoning-gym's own classes: its datasets and their config fields change between releases, and
a hand-kept list would drift; the defaults shown are the ones a run gets (this project's presets applied over
reasoning-gym's), so `swarm tasks` tells a user exactly what `task_config` would change.
"""

from __future__ import annotations

import dataclasses
import difflib
import sys
from collections.abc import Sequence

from tasks.builtin import DEFAULT_CONFIGS, SCORERS
from tasks.errors import TaskError

RUN_SET_FIELDS = ("seed", "size")
"""Config fields every run sets itself (the task seed and task_size), so they are no difficulty setting."""


@dataclasses.dataclass(frozen=True)
class BuiltinTask:
    name: str
    description: str  # first line of the dataset's docstring (or its config's)
    settings: dict  # difficulty field -> the default a run gets (JSON-ready: tuples as lists)


def builtin_tasks(names: Sequence[str] = ()) -> list[BuiltinTask]:
    """Every built-in task, or those named (one sentence, with the nearest names, for a name that is none)."""
    from reasoning_gym.factory import DATASETS

    for name in names:
        if name not in DATASETS:
            near = difflib.get_close_matches(name, list(DATASETS), n=3)
            hint = f" (did you mean {', '.join(near)}?)" if near else ""
            raise TaskError(f"{name!r} is not a built-in task{hint}; `swarm tasks` lists them all")
    chosen = list(names) or sorted(DATASETS)
    shared = _shared_docstrings(DATASETS)
    return [_describe(name, *DATASETS[name], shared) for name in chosen]


def _shared_docstrings(datasets: dict) -> set[str]:
    """First docstring lines that more than one dataset class carries: copied from another dataset, so they may
    describe that one (number_format's says "Generates Count Bits exercises")."""
    lines = [_first_line(dataset_class.__doc__) for dataset_class, _ in datasets.values()]
    return {line for line in lines if line and lines.count(line) > 1}


def _describe(name: str, dataset_class, config_class, shared: set[str] = frozenset()) -> BuiltinTask:
    settings = {}
    for field in dataclasses.fields(config_class):
        if field.name in RUN_SET_FIELDS:
            continue
        settings[field.name] = _json_ready(_default(field))
    settings.update(DEFAULT_CONFIGS.get(name, {}))
    return BuiltinTask(name, _description(name, dataset_class, config_class, shared), settings)


def _description(name: str, dataset_class, config_class, shared: set[str]) -> str:
    """The first of: the dataset class's own docstring line (unless other datasets share it), its module's, its
    config class's (unless it is the signature a dataclass writes for itself), or the task's name in words."""
    own = _first_line(dataset_class.__doc__)
    module = _first_line(getattr(sys.modules.get(dataset_class.__module__), "__doc__", None))
    config = _first_line(config_class.__doc__)
    candidates = (own if own not in shared else "", module, own,
                  "" if config.startswith(f"{config_class.__name__}(") else config)
    return next((text for text in candidates if text), f"{name.replace('_', ' ')} puzzles")


def _default(field: dataclasses.Field):
    if field.default is not dataclasses.MISSING:
        return field.default
    if field.default_factory is not dataclasses.MISSING:
        return field.default_factory()
    return None


def _json_ready(value):
    if isinstance(value, (tuple, list, set, frozenset)):
        return [_json_ready(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _json_ready(v) for k, v in value.items()}
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return _json_ready(dataclasses.asdict(value))
    return str(value)


def _first_line(doc: str | None) -> str:
    line = (doc or "").strip().splitlines()[0].strip() if (doc or "").strip() else ""
    for prefix in ("Configuration for ", "Config for "):
        if line.startswith(prefix):
            line = line[len(prefix):]
    return line.rstrip(".:")


def scorer_note() -> str:
    """How a run picks a task's reward function (the `scorer` key of task_config)."""
    return f"task_config may also name a scorer: {', '.join(SCORERS)}"
