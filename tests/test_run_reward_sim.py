"""A swarm whose trainer names its own reward: workers claim it, validators recompute it and accept, and the
trainer steps on what it scored (the built-in gcd scorer gives only 0 and 1, this reward only 0.3 and 0.6)."""

from __future__ import annotations

import io

import pytest
import trio

from swarm.event_types import RewardRefused, TrainStep
from swarm.events import Emitted, EventSink
from swarm.sim.run import SimSettings, run_sim, summarize

REWARD = "def score(completions, answer, **_):\n    return [0.3 + 0.3 * (len(c) % 2) for c in completions]\n"


@pytest.mark.timeout(200)
def test_a_swarm_trains_on_rollouts_its_validators_accept_under_the_runs_own_reward(tmp_path):
    reward = tmp_path / "parity_reward.py"
    reward.write_text(REWARD)
    config = tmp_path / "trainer.toml"
    config.write_text("\n".join([
        "[trainer]", 'model = "tiny"', 'task = "gcd"', "task_size = 64", 'curriculum = "none"', "max_new_tokens = 8",
        "group_size = 4", "prompts_per_step = 2", "steps_per_policy = 1", f'reward = "{reward}:score"']) + "\n")
    settings = SimSettings(out=tmp_path / "sim", inference=1, validators=1, seeds=0, prompts_per_worker=2, steps=2,
                           async_level=0, trainer_config=config, timeout_s=150.0, watch_s=20.0)
    events: list[Emitted] = []
    sink = EventSink(json_lines=True, stream=io.StringIO())
    sink.listeners.append(events.append)
    report = summarize(events, trio.run(run_sim, settings, sink))
    assert not report["timed_out"] and report["steps"] == 2
    steps = [e.event for e in events if isinstance(e.event, TrainStep)]
    rewards = [r for e in steps for r in e.group_rewards]
    assert rewards and all(0.3 <= r <= 0.6 for r in rewards)
    assert all(isinstance(getattr(e, key), float) for e in steps for key in ("loss", "kl", "lr", "step_seconds"))
    assert steps[-1].gate.get("accepted", 0) >= 2 and not any(isinstance(e.event, RewardRefused) for e in events)
