"""`swarm eval --compare BEFORE AFTER`: what one policy gains over another on the same held-out prompts.

Why paired over prompts: two evaluations of 200 prompts each differ by a few points from which prompts either
policy happens to get right, while the prompts both get right or both get wrong say nothing about the change.
The per-prompt difference (1 gained, -1 lost, 0 unchanged) averaged over the prompts both files scored, with a
seeded 95 % percentile bootstrap over those prompts, is the gain and its sampling error on this prompt set; the
interval is about the prompts, not about the training seed, so a gain seen on one seed is not yet a method's gain.
"""

from __future__ import annotations

import json
from pathlib import Path

from swarm.bench.curriculum_stats import bootstrap_mean
from swarm.errors import UserError
from trainer.answer_readings import READINGS

_VERDICT_KEYS = {"reward": "correct", "last_number": "last_number", "any_number": "any_number"}


def read_per_prompt(path: Path) -> dict[int, dict]:
    """The verdicts of a `swarm eval --per-prompt` file by prompt index; one sentence when it is not one."""
    try:
        lines = path.read_text().splitlines()
    except OSError as exc:
        raise UserError(f"cannot read per-prompt file {path}: {exc.strerror or exc}") from None
    rows = {}
    for number, line in enumerate(lines, 1):
        try:
            row = json.loads(line)
            rows[int(row["index"])] = {key: bool(row[field]) for key, field in _VERDICT_KEYS.items()}
        except (ValueError, TypeError, KeyError):
            raise UserError(f"{path} line {number} is not a `swarm eval --per-prompt` line") from None
    return rows


def paired_gains(before: dict[int, dict], after: dict[int, dict]) -> dict:
    """Per reading: both accuracies, the mean per-prompt difference after - before with its 95 % interval, and the
    prompts gained and lost, over the prompts both evaluations scored (refused when they scored different ones)."""
    if set(before) != set(after):
        raise UserError(f"the two evaluations scored different prompts ({len(set(before) ^ set(after))} differ): "
                        f"give both the same --config, --seed and --n")
    indices = sorted(before)
    out = {"n": len(indices)}
    for reading in READINGS:
        was = [int(before[i][reading]) for i in indices]
        now = [int(after[i][reading]) for i in indices]
        diffs = [b - a for a, b in zip(was, now)]
        out[reading] = {"before": sum(was) / len(indices), "after": sum(now) / len(indices),
                        "difference": bootstrap_mean(diffs).to_dict(),
                        "gained": diffs.count(1), "lost": diffs.count(-1)}
    return out


def compare(before_path: Path, after_path: Path, as_json: bool) -> int:
    """Print the paired gains of AFTER over BEFORE, as one JSON line or a line per reading."""
    before, after = read_per_prompt(before_path), read_per_prompt(after_path)
    if not before:
        raise UserError(f"{before_path} scores no prompts")
    gains = paired_gains(before, after)
    if as_json:
        print(json.dumps(gains))
        return 0
    for reading in READINGS:
        g = gains[reading]
        low, high = g["difference"]["ci95"]
        print(f"{reading}: {g['before']:.3f} -> {g['after']:.3f}, paired difference {g['difference']['mean']:+.3f} "
              f"(95 % interval {low:+.3f}..{high:+.3f}; {g['gained']} gained, {g['lost']} lost, n {gains['n']})")
    return 0
