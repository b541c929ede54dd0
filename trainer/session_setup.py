"""What a training session (trainer/session.py) and its generator process (trainer/generator_process.py) both set
up first, identically: the seeded random generators and the split of the task set into train and held-out prompts.
"""

from __future__ import annotations

import random

import numpy as np
import torch

from tasks import load_tasks
from tasks.loading import is_builtin_task
from trainer.config import TrainerConfig, apply_reward
from trainer.errors import TrainerError


def seed_everything(seed: int) -> None:
    """Python's, numpy's and torch's global generators, all from the run's seed."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def load_task_split(cfg: TrainerConfig):
    """(train, heldout) task sets: the held-out split is never offered to the generator."""
    size = cfg.task_size if is_builtin_task(cfg.task) else None
    tasks = load_tasks(cfg.task, size=size, seed=cfg.seed, config=cfg.task_config or None,
                       prompt_key=cfg.prompt_key, answer_key=cfg.answer_key)
    train_set, heldout = apply_reward(cfg, tasks).split(cfg.eval_fraction, seed=cfg.seed)
    if len(train_set) == 0 or len(heldout) == 0:
        raise TrainerError(f"task set {cfg.task!r} is too small to split into train and held-out prompts")
    return train_set, heldout
