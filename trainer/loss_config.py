"""The hyper-parameters of the GRPO loss, in a module without torch: the trainer's config (trainer/config.py)
builds them while it loads and validates, and the loss (trainer/grpo.py) reads them."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class LossConfig:
    """The hyper-parameters of one GRPO loss evaluation (defaults: INTELLECT-2's final run)."""

    clip_delta: float = 4.0  # ratio cap applied before the PPO clip, so a negative advantage cannot blow up
    eps_low: float = 0.2  # PPO clip: ratio >= 1 - eps_low
    eps_high: float = 0.2  # PPO clip: ratio <= 1 + eps_high
    entropy_coef: float = 0.001  # entropy bonus (subtracted from the loss)
    kl_coef: float = 0.0  # k3 KL to a reference policy; INTELLECT-2 removed it, FastCuRL used 0.001
    decoupled: bool = False  # clip against the step's own starting policy, staleness as a capped weight (below)
