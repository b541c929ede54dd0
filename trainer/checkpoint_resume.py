"""Which checkpoint a run resumes from, and whether an output directory may be resumed at all.

Why a run identity: re-running with the same `out` continues the run found there, so an `out` reused by mistake for
another model, task or config would silently train the old run on. Each checkpoint records the settings that decide
what is trained (`run_identity`); a run whose settings differ is refused in one sentence unless `resume` says to
continue it anyway. Why a fallback: a run that has trained for days must not stop because its newest checkpoint
was cut short; the newest one that verifies is resumed, and each one skipped is named with the reason.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from pathlib import Path

from trainer.checkpoint import TrainerState, list_checkpoints, verify_checkpoint
from trainer.errors import TrainerError

log = logging.getLogger(__name__)

RUN_KEY = "run"
"""Where a checkpoint's state.json keeps the run identity (under "extra", which travels with TrainerState)."""

OPERATIONAL_FIELDS = frozenset({
    "out", "steps", "time_limit_min", "eval_every", "eval_n", "threads", "generator", "generator_threads",
    "generator_prefetch", "generator_own_session", "generator_timeout_s", "parallel", "device", "report_to",
    "resume", "resume_from", "keep_last", "checkpoint_every"})
"""TrainerConfig fields that change how a run is carried out, not what it trains: they may differ on resume."""


class AnotherRun(TrainerError):
    """The output directory holds a run of other settings: refused outright, never skipped for an older one."""


def run_identity(cfg) -> dict:
    """The settings that decide what a run trains, as JSON values."""
    fields = cfg.model_dump(mode="json")
    return {name: value for name, value in sorted(fields.items()) if name not in OPERATIONAL_FIELDS}


def identity_difference(recorded: dict, current: dict) -> str:
    """The settings of two runs that differ, as `name 'old' (now 'new')`, at most three of them."""
    names = sorted(name for name in set(recorded) | set(current) if recorded.get(name) != current.get(name))
    shown = ", ".join(f"{name} {recorded.get(name)!r} (now {current.get(name)!r})" for name in names[:3])
    return shown + (f" and {len(names) - 3} more" if len(names) > 3 else "")


def recorded_identity(checkpoint: Path) -> dict | None:
    """The run identity a checkpoint's state.json records, or None when it records none."""
    try:
        meta = json.loads((Path(checkpoint) / "state.json").read_text())
    except (OSError, ValueError):
        raise TrainerError(f"{Path(checkpoint) / 'state.json'} is unreadable") from None
    found = meta.get("extra", {}).get(RUN_KEY)
    return found if isinstance(found, dict) else None


def resume(cfg, load: Callable[[Path], TrainerState],
           say: Callable[[str], None] = log.warning) -> tuple[Path, TrainerState] | None:
    """Load the checkpoint the run continues from; None for a fresh run (an `out` with no checkpoint).

    `load(path)` restores a checkpoint into the live model and raises TrainerError when it cannot; `say` gets one
    line per checkpoint skipped and one naming the step resumed from."""
    out = Path(cfg.out)
    if cfg.resume_from:
        chosen = Path(cfg.resume_from)
        if not (chosen / "state.json").is_file():
            raise TrainerError(f"--resume-from {chosen} is not a checkpoint directory (no state.json in it)")
        state = load(chosen)
        say(f"resuming {out} from step {state.step} ({chosen})")
        return chosen, state
    found = list(reversed(list_checkpoints(out / "checkpoints")))
    if not found:
        if cfg.resume:
            raise TrainerError(f"--resume: {out} holds no checkpoint to resume; leave out --resume to start afresh")
        return None
    for path in found:
        try:
            verify_checkpoint(path)
            refuse_another_run(cfg, path)
            state = load(path)
        except TrainerError as exc:
            if isinstance(exc, AnotherRun):
                raise
            say(f"skipped checkpoint {path}: {exc}")
            continue
        say(f"resuming {out} from step {state.step} ({path})")
        return path, state
    raise TrainerError(f"{out} holds {len(found)} checkpoint(s) and none of them verifies (each is named above); "
                       "give another --out, or --resume-from a copy you trust")


def refuse_another_run(cfg, checkpoint: Path) -> None:
    """Raise TrainerError when `checkpoint` was written by a run of other settings and `cfg.resume` is not set."""
    recorded = recorded_identity(checkpoint)
    current = run_identity(cfg)
    if cfg.resume or recorded is None or recorded == current:
        return
    raise AnotherRun(f"{cfg.out} holds another run: {identity_difference(recorded, current)}; give another --out "
                     "(a trainer peer: --data-dir), or --resume (a trainer peer: resume = true in its "
                     "--trainer-config) to continue that run with these settings")
