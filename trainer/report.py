"""Progress lines, the reward plot of a training run, and reward-against-wall-time comparisons of runs.

Why matplotlib's Agg backend: it is installed with the project's stack and renders a PNG without a display; the
plot is optional output, so a missing matplotlib only skips the picture (the JSON log holds every number).
"""

from __future__ import annotations

import json
from pathlib import Path

from trainer.step_record import StepRecord


def progress_line(record: StepRecord, total_steps: int) -> str:
    """One human line per step: step, reward, stage, version, throughput and what was dropped."""
    extra = f" skipped={record.skipped}" if record.skipped else ""
    if record.refused:
        extra += f" refused={record.refused}"
    return (f"step {record.step + 1}/{total_steps} reward {record.reward:.3f} stage {record.stage} "
            f"v{record.version} groups {record.groups_trained}/{record.groups} loss {record.loss:+.4f} "
            f"entropy {record.entropy:.2f} tok/s {record.tokens_per_s:.0f} t {record.wall_s:.0f}s{extra}")


def read_log(path: Path) -> list[dict]:
    path = Path(path)
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def plot_rewards(log: list[dict], evals: list[dict], target: Path, title: str) -> Path | None:
    """Reward per step (and its moving average), held-out accuracy at each evaluation; None without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    steps = [r["step"] + 1 for r in log]
    rewards = [r["reward"] for r in log]
    window = max(1, len(rewards) // 10)
    smooth = trailing_means(log, window)
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot(steps, rewards, alpha=0.35, label="mean reward per step")
    ax.plot(steps, smooth, label=f"moving average ({window})")
    if evals:
        ax.plot([e["step"] for e in evals], [e["accuracy"] for e in evals], "o-", label="held-out accuracy")
    return _save_plot(fig, ax, "optimizer step", "reward / accuracy", title, target)


def trailing_means(log: list[dict], window: int) -> list[float]:
    """Mean reward of the last `window` steps at each step (fewer at the start)."""
    rewards = [r["reward"] for r in log]
    return [sum(rewards[max(0, i - window + 1): i + 1]) / len(rewards[max(0, i - window + 1): i + 1])
            for i in range(len(rewards))]


def compare_runs(runs: dict[str, list[dict]], threshold: float | None = None, window: int = 5) -> dict:
    """Reward against wall time for several runs, and when each first reached `threshold`.

    Why wall time and a trailing mean: async-k's claim is "the same reward sooner", so the figure is the first
    wall_s (seconds since the session started, model loads and the first evaluation included) at which the
    `window`-step mean reward reaches the threshold; one step's reward is too noisy to mark it. The default
    threshold is the first run's final trailing mean (list the synchronous run first).
    """
    if not runs or not all(runs.values()):
        raise ValueError("every compared run needs a non-empty log")
    curves = {label: trailing_means(log, window) for label, log in runs.items()}
    if threshold is None:
        threshold = curves[next(iter(runs))][-1]
    result = {"threshold": threshold, "window": window, "runs": {}}
    for label, log in runs.items():
        reach = next((i for i, mean in enumerate(curves[label]) if mean >= threshold), None)
        result["runs"][label] = {
            "steps": len(log), "wall_s": log[-1]["wall_s"], "final_mean": curves[label][-1],
            "reach_step": None if reach is None else log[reach]["step"] + 1,
            "reach_s": None if reach is None else log[reach]["wall_s"],
            "curve": [[r["wall_s"], round(m, 4)] for r, m in zip(log, curves[label])],
        }
    return result


def compare_groups(groups: dict[str, list[list[dict]]], threshold: float | None = None, window: int = 5,
                   grid_s: float = 0.25) -> dict:
    """Like compare_runs, for groups of runs that differ only in their seed: the seed-mean curve reaches or not.

    Why: one seed of a small RL run is noisy enough (the tiny policy collapses onto different answers per seed) to
    reverse a comparison by itself, so each configuration is run over several seeds and compared by its mean curve:
    at every `grid_s` of wall time the mean over seeds of each seed's trailing mean reward, a seed counting with its
    first value before its first step (the initial policy's reward) and its final value after its last. The
    threshold defaults to the first group's final mean (list the synchronous group first). Per-seed reach times
    against the same threshold are reported too.
    """
    if not groups or not all(groups.values()) or not all(log for logs in groups.values() for log in logs):
        raise ValueError("every compared group needs at least one non-empty log")
    means = {label: [trailing_means(log, window) for log in logs] for label, logs in groups.items()}
    if threshold is None:
        finals = [curve[-1] for curve in means[next(iter(groups))]]
        threshold = sum(finals) / len(finals)
    result = {"threshold": threshold, "window": window, "grid_s": grid_s, "runs": {}}
    for label, logs in groups.items():
        start = min(log[0]["wall_s"] for log in logs)
        end = max(log[-1]["wall_s"] for log in logs)
        curve = []
        for i in range(int((end - start) / grid_s) + 2):
            t = min(start + i * grid_s, end)
            values = [_value_at(log, seed_means, t) for log, seed_means in zip(logs, means[label])]
            curve.append((t, sum(values) / len(values)))
        reach = next((round(t, 3) for t, mean in curve if mean >= threshold - 1e-12), None)
        seed_reach = [next((r["wall_s"] for r, m in zip(log, seed_means) if m >= threshold - 1e-12), None)
                      for log, seed_means in zip(logs, means[label])]
        result["runs"][label] = {
            "seeds": len(logs), "wall_s": [log[-1]["wall_s"] for log in logs],
            "final_mean": sum(m[-1] for m in means[label]) / len(logs),
            "reach_s": reach, "seed_reach_s": seed_reach,
            "curve": [[round(t, 3), round(mean, 4)] for t, mean in curve],
        }
    return result


def _value_at(log: list[dict], means: list[float], t: float) -> float:
    """A run's trailing mean at wall time t: its first value before its first step, its last after its end."""
    value = means[0]
    for record, mean in zip(log, means):
        if record["wall_s"] > t:
            break
        value = mean
    return value


def plot_comparison(result: dict, target: Path, title: str) -> Path | None:
    """Trailing-mean reward against wall time, one line per run, the threshold dashed; None without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    fig, ax = plt.subplots(figsize=(7, 4))
    for label, run in result["runs"].items():
        reach = f", reached at {run['reach_s']:.0f} s" if run["reach_s"] is not None else ", never reached"
        seeds = f" (mean of {run['seeds']} seeds)" if run.get("seeds", 1) > 1 else ""
        ax.plot([p[0] for p in run["curve"]], [p[1] for p in run["curve"]], label=f"{label}{seeds}{reach}")
    ax.axhline(result["threshold"], linestyle="--", color="grey", label=f"threshold {result['threshold']:.3f}")
    return _save_plot(fig, ax, "wall time since session start (s)", f"mean reward of the last {result['window']} steps",
                      title, target)


def _save_plot(fig, ax, xlabel: str, ylabel: str, title: str, target) -> Path:
    """Label, lay out, write and close a figure (closing frees it: long runs plot many times)."""
    import matplotlib.pyplot as plt

    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.legend()
    fig.tight_layout()
    fig.savefig(target, dpi=100)
    plt.close(fig)
    return Path(target)
