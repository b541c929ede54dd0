"""Progress lines and the reward plot of a training run.

Why matplotlib's Agg backend: it is installed with the project's stack and renders a PNG without a display; the
plot is optional output, so a missing matplotlib only skips the picture (the JSON log holds every number).
"""

from __future__ import annotations

import json
from pathlib import Path


def progress_line(record: dict, total_steps: int) -> str:
    """One human line per step: step, reward, stage, version, throughput and what was dropped."""
    extra = f" skipped={record['skipped']}" if record.get("skipped") else ""
    if record.get("refused"):
        extra += f" refused={record['refused']}"
    return (f"step {record['step'] + 1}/{total_steps} reward {record['reward']:.3f} stage {record['stage']} "
            f"v{record['version']} groups {record['groups_trained']}/{record['groups']} loss {record['loss']:+.4f} "
            f"entropy {record['entropy']:.2f} tok/s {record['tokens_per_s']:.0f} t {record['wall_s']:.0f}s{extra}")


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
    smooth = [sum(rewards[max(0, i - window + 1): i + 1]) / len(rewards[max(0, i - window + 1): i + 1])
              for i in range(len(rewards))]
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot(steps, rewards, alpha=0.35, label="mean reward per step")
    ax.plot(steps, smooth, label=f"moving average ({window})")
    if evals:
        ax.plot([e["step"] for e in evals], [e["accuracy"] for e in evals], "o-", label="held-out accuracy")
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("reward / accuracy")
    ax.set_title(title)
    ax.legend()
    fig.tight_layout()
    fig.savefig(target, dpi=100)
    plt.close(fig)
    return Path(target)
