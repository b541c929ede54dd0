"""The trainer's step figures on its Prometheus endpoint, and docs/grafana/swarm.json: every metric the dashboard
queries is one a peer serves (a renamed metric would leave a panel silently empty)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from types import SimpleNamespace

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from swarm.event_types import TrainStep
from swarm.events import Emitted
from swarm.node.metrics import RoleCounters, node_registry

DASHBOARD = Path(__file__).resolve().parent.parent / "docs" / "grafana" / "swarm.json"
STEP = Emitted(TrainStep(step=4, reward=0.5, stage="s", loss=-0.02, kl=0.001, entropy=1.25, lr=1e-3,
                         step_seconds=2.5, gate={"accepted": 6, "rejected": 1, "refused:stale": 2, "vote:accept": 9}),
               0.0)


def fake_node():
    stats = SimpleNamespace(delivered=3, published=2, rejected={"bad_signature": 1}, bytes_delivered=300,
                            bytes_published=200, dropped_slow_consumer=0, bans=1)
    config = SimpleNamespace(peer=SimpleNamespace(run="demo", roles=("trainer",)))
    return SimpleNamespace(mirror=SimpleNamespace(policies={}, latest=lambda: None), gossip=SimpleNamespace(
        stats=stats), peer_id="12D3KooTest", config=config, peer_roles={}, events=SimpleNamespace(listeners=[]),
        host=SimpleNamespace(connection_counts=lambda: {"inbound": 1, "outbound": 2}))


def served(*events: Emitted) -> dict[str, float]:
    """{sample name: value} a scrape of a trainer peer shows after `events` (label sets folded)."""
    node = fake_node()
    registry = node_registry(node)
    for event in events:
        for listener in node.events.listeners:
            listener(event)
    text = generate_latest(registry).decode()
    return {s.name: s.value for family in text_string_to_metric_families(text) for s in family.samples}


def test_a_trainer_serves_its_last_steps_reward_loss_kl_entropy_learning_rate_step_time_and_gate_groups():
    before = served()
    assert not [name for name in before if name.startswith("rlswarm_trainer_") and name != "rlswarm_trainer_step"]
    metrics = served(STEP)
    assert {name: metrics[name] for name in ("rlswarm_trainer_reward", "rlswarm_trainer_loss", "rlswarm_trainer_kl",
                                             "rlswarm_trainer_entropy", "rlswarm_trainer_learning_rate",
                                             "rlswarm_trainer_step_seconds", "rlswarm_trainer_step")} == {
        "rlswarm_trainer_reward": 0.5, "rlswarm_trainer_loss": -0.02, "rlswarm_trainer_kl": 0.001,
        "rlswarm_trainer_entropy": 1.25, "rlswarm_trainer_learning_rate": 1e-3, "rlswarm_trainer_step_seconds": 2.5,
        "rlswarm_trainer_step": 4}
    assert "rlswarm_gate_groups_total" in metrics


def test_a_step_without_figures_or_with_junk_keeps_the_last_good_ones():
    roles = RoleCounters()
    roles.on_event(STEP)
    roles.on_event(Emitted(TrainStep(step=5, reward=None, stage="s", loss=float("nan"), kl=True, lr="x"), 0.0))
    assert roles.trainer_figures["reward"] == 0.5 and roles.trainer_figures["loss"] == -0.02
    assert roles.trainer_figures["kl"] == 0.001 and roles.trainer_step == 5


def queried_metrics(dashboard: dict) -> set[str]:
    expressions = [target["expr"] for panel in dashboard["panels"] for target in panel["targets"]]
    expressions += [v["query"] for v in dashboard["templating"]["list"] if v["type"] == "query"]
    return {name for text in expressions for name in re.findall(r"\brlswarm_[a-z0-9_]+", text)}


def test_every_metric_the_dashboard_queries_is_one_a_peer_serves():
    dashboard = json.loads(DASHBOARD.read_text())
    queried = queried_metrics(dashboard)
    assert queried - set(served(STEP)) == set()
    trainer = {"rlswarm_trainer_reward", "rlswarm_trainer_loss", "rlswarm_trainer_kl", "rlswarm_trainer_entropy",
               "rlswarm_trainer_learning_rate", "rlswarm_trainer_step_seconds", "rlswarm_gate_groups_total"}
    assert trainer <= queried and all(panel["targets"] for panel in dashboard["panels"])


def test_the_check_catches_a_metric_no_peer_serves():
    dashboard = {"panels": [{"targets": [{"expr": "rate(rlswarm_no_such_metric_total[5m])"}]}],
                 "templating": {"list": []}}
    assert queried_metrics(dashboard) - set(served(STEP)) == {"rlswarm_no_such_metric_total"}
