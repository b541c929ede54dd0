"""The simulation's cheating worker: the real inference role, whose every completion then claims reward 1.0.

It lives with the simulation, not in the inference role's config, because no production peer has a reason to run
it: it exists to show the validators' quorum refusing fabricated rewards and the trainer's reputation banning the
worker that sent them.
"""

from __future__ import annotations

import functools
from dataclasses import replace

from swarm.node.context import role_part
from swarm.roles.inference import inference_role
from verify.rollout import RolloutGroup


def claim_full_reward(groups: list[RolloutGroup]) -> list[RolloutGroup]:
    """Every completion of every group claims reward 1.0, whatever it earned."""
    return [replace(g, completions=tuple(replace(c, reward=1.0) for c in g.completions)) for g in groups]


cheating_inference_role = role_part(functools.partial(inference_role, tamper=claim_full_reward),
                                    lambda config: config.inference)
