"""`swarm sim`: the whole swarm on one machine, every peer a real libp2p host on loopback, in one process.

One trainer (it holds the run key), inference peers, validators and a seed-only peer join through the trainer's
multiaddr, exactly as separate machines would. The trainer trains only on rollouts a quorum of validators accepted;
an optional cheating worker (it claims reward 1.0 for every completion) shows the quorum refusing its rollouts and
reputation banning it. Torch work runs in worker threads, so the networking of every peer stays live.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch
import trio

from p2p.identity import load_or_create_identity
from swarm.config import load_config
from swarm.event_types import (
    Complete,
    DhtFound,
    Generated,
    Generating,
    Published,
    RejectedRollout,
    RoleFailed,
    Stalled,
    Trained,
    TrainStep,
    Validated,
)
from swarm.events import Emitted, EventSink
from swarm.node.node import open_node_parts
from swarm.node.state import Node
from swarm.roles.registry import ROLE_TASKS
from swarm.sim.cheater import cheating_inference_role
from swarm.sim.report_html import render_html
from swarm.sim.timeline import timeline
from swarm.sim.transfer import transfer
from tasks.loading import is_task_file
from trainer.config import TrainerConfig, render_toml
from trainer.config import load_config as load_trainer_config  # `load_config` here is the sim's own


@dataclass(frozen=True)
class SimSettings:
    out: Path
    inference: int = 2
    validators: int = 2
    seeds: int = 1
    cheaters: int = 0
    steps: int = 16
    lr: float | None = None  # None: the trainer's default
    prompts_per_worker: int = 4
    prompts_per_step: int = 0  # 0: half of what the honest workers answer per version
    group_size: int = 16
    max_new_tokens: int = 8
    curriculum: str = "fastcurl"  # or "none" or a [[stage]] TOML file: see _trainer_toml for why fastcurl
    model: str = "tiny"
    task: str = TrainerConfig.model_fields["task"].default
    task_config: str = "{}"  # TOML inline table of the task's difficulty settings
    prompt_key: str = "prompt"  # the task file's or hub dataset's prompt column
    answer_key: str = "answer"  # ... and its answer column
    async_level: int = 1  # cli.sim.SIM_ASYNC_LEVEL: the one trainer default the simulation overrides
    eval_every: int = 0  # held-out evaluations between steps (one before the first and one after the last always)
    time_limit_min: float = 0.0  # > 0: the trainer stops stepping after this many minutes
    trainer_config: Path | None = None  # a trainer TOML that decides model, task, sizes and curriculum instead
    timeout_s: float = 900.0
    watch_s: float = 30.0  # the watchdog reports every peer's state after this long without a trainer step
    report_to: str = "none"  # the trainer's experiment trackers (trainer.tracking), under out/trainer/training
    metrics_port: int = 0  # > 0: the trainer's Prometheus port; each further peer takes the next one


@dataclass
class SimPeer:
    name: str
    roles: tuple[str, ...]
    node: object = None
    ready: trio.Event = field(default_factory=trio.Event)
    metrics_port: int = 0


def _trainer_toml(s: SimSettings) -> Path:
    """The trainer's config: the trainer's defaults (its learning rate among them), sized to the simulation.

    FastCuRL's stages, so the simulation shows the curriculum driving generation through the signed manifest (the
    stage in force rides in every policy's generation settings). In 16 steps the tiny model learns which answer
    to give and to stop after it (inference.tiny); the report prints the most-frequent-answer line beside held-out
    accuracy, since most of that gain is learning gcd's most common answer.
    """
    path = s.out / "trainer.toml"
    path.parent.mkdir(parents=True, exist_ok=True)
    if s.trainer_config is not None:
        path.write_text(_trainer_toml_from_file(s))
        return path
    workers = s.inference + s.cheaters
    path.write_text("\n".join([
        "[trainer]", f'model = "{s.model}"', f"task = {json.dumps(task_reference(s.task))}",
        f"task_config = {s.task_config}", f"prompt_key = {json.dumps(s.prompt_key)}",
        f"answer_key = {json.dumps(s.answer_key)}",
        "task_size = 400", f"steps = {s.steps}", "temperature = 1.0", "grad_clip = 1.0", "threads = 1",
        f"prompts_per_step = {s.prompts_per_step or max(1, (s.inference * s.prompts_per_worker) // 2)}",
        f"group_size = {s.group_size}",
        f"max_new_tokens = {s.max_new_tokens}", "steps_per_policy = 1", f"async_level = {s.async_level}",
        f"curriculum = {json.dumps(s.curriculum)}", "checkpoint_every = 1000", f"eval_every = {s.eval_every}",
        f"time_limit_min = {s.time_limit_min}", f"report_to = {json.dumps(s.report_to)}", f"# {workers} workers",
        *([] if s.lr is None else [f"lr = {s.lr}"]),
    ]) + "\n")
    return path


def _trainer_toml_from_file(s: SimSettings) -> str:
    """The run's own trainer TOML with only what a simulation must change: its asynchronous window, one torch
    thread (every peer shares this machine's cores), no checkpoints but the last (a simulation always starts
    fresh), the command's steps, evaluation interval, time limit and trackers, and files named by absolute path."""
    overrides = {"async_level": s.async_level, "threads": 1, "checkpoint_every": max(s.steps, 1000),
                 "steps": s.steps, "eval_every": s.eval_every, "time_limit_min": s.time_limit_min,
                 "report_to": s.report_to, "task": task_reference(s.task)}
    if Path(s.curriculum).is_file():  # [[stage]] tables of the config itself take precedence over this field
        overrides["curriculum"] = str(Path(s.curriculum).resolve())
    return render_toml(load_trainer_config(s.trainer_config, overrides))


def task_reference(task: str) -> str:
    """A task file by its absolute path (the trainer reads it; the other peers get it with every policy), a
    built-in task set by name."""
    return str(Path(task).resolve()) if is_task_file(task) else task


def _peer_config(s: SimSettings, peer: SimPeer, bootstrap: tuple[str, ...], trainer_toml: Path):
    return load_config(None, {
        "roles": peer.roles, "run": "sim", "data_dir": s.out / peer.name, "bootstrap": bootstrap,
        "bootstrap_file": s.out / "no-bootstrap.txt", "model": s.model, "trainer_config": trainer_toml,
        "prompts_per_worker": s.prompts_per_worker, "replicas": min(2, max(1, s.validators)),
        "quorum": min(2, max(1, s.validators)), "quorum_timeout_s": 120.0, "exit_when_trained": True,
        "status_every_s": 3.0, "data_exempt_loopback": True,  # every peer is ours, on 127.0.0.1
        "metrics_port": peer.metrics_port})


async def run_sim(s: SimSettings, sink: EventSink, on_stopping: Callable[[dict], None] = lambda extra: None) -> dict:
    """Run every peer until the trainer is done (or `timeout_s`); returns {timed_out, wall_s}. `on_stopping` gets
    that dict once the work is over and the peers start closing (swarm.shutdown bounds how long that may take)."""
    torch.set_num_threads(1)
    import transformers  # noqa: F401 - resolve its lazy classes in this thread before role threads race for them
    from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: F401

    trainer_toml = _trainer_toml(s)
    peers = [SimPeer("trainer", ("trainer",))]
    peers += [SimPeer(f"validator{i}", ("validator",)) for i in range(s.validators)]
    peers += [SimPeer(f"inference{i}", ("inference",)) for i in range(s.inference)]
    peers += [SimPeer(f"cheater{i}", ("inference",)) for i in range(s.cheaters)]
    peers += [SimPeer(f"seed{i}", ("seed",)) for i in range(s.seeds)]
    for index, peer in enumerate(peers if s.metrics_port else ()):
        peer.metrics_port = s.metrics_port + index
    started = time.monotonic()
    watch = Activity()
    sink.listeners.append(watch.on_event)  # every peer's sink copies the listeners: add it before peers start

    async def start(nursery: trio.Nursery, peer: SimPeer, bootstrap: tuple[str, ...]) -> None:
        config = _peer_config(s, peer, bootstrap, trainer_toml)
        config.peer.data_dir.mkdir(parents=True, exist_ok=True)
        identity = load_or_create_identity(config.peer.data_dir)

        async def capture(node: Node) -> None:
            peer.node = node
            peer.ready.set()

        peer_sink = EventSink(json_lines=sink.json_lines, stream=sink.stream, peer=peer.name)
        peer_sink.listeners += sink.listeners
        tasks = {**ROLE_TASKS, "inference": cheating_inference_role} if peer.name.startswith("cheater") else ROLE_TASKS
        roles = [capture] + [tasks[r] for r in peer.roles if r in tasks]
        trust = identity.public_bytes if "trainer" in peer.roles else peers[0].node.identity.public_bytes
        nursery.start_soon(open_node_parts, config, identity, peer_sink, roles, trust)
        await peer.ready.wait()

    with trio.move_on_after(s.timeout_s) as scope:
        async with trio.open_nursery() as nursery:
            await start(nursery, peers[0], ())
            bootstrap = (peers[0].node.host.multiaddrs[0],)
            for peer in peers[1:]:
                await start(nursery, peer, bootstrap)
            watchdog = trio.CancelScope()
            nursery.start_soon(_watch, peers, watch, watchdog, s.watch_s)
            await peers[0].node.done.wait()
            watchdog.cancel()
            on_stopping({"timed_out": False, "wall_s": round(time.monotonic() - started, 1)})
            for peer in peers[1:]:
                peer.node.done.set()
    return {"timed_out": scope.cancelled_caught, "wall_s": round(time.monotonic() - started, 1)}


@dataclass
class Activity:
    """What each peer did last (its role's latest milestone event) and how many steps the trainer has taken."""

    MILESTONES = (Published, TrainStep, Generating, Generated, Validated, Complete, RoleFailed, DhtFound)
    steps: int = 0
    last: dict[str, tuple[str, int | None, float]] = field(default_factory=dict)  # peer -> (event, version, time)

    def on_event(self, e: Emitted) -> None:
        if isinstance(e.event, TrainStep):
            self.steps += 1
        if isinstance(e.event, self.MILESTONES):
            self.last[e.peer or "?"] = (e.event.kind, getattr(e.event, "version", None), time.monotonic())

    def describe(self, peer: str) -> str:
        if peer not in self.last:
            return "nothing yet"
        kind, version, at = self.last[peer]
        return f"{kind}{'' if version is None else f' v{version}'} {time.monotonic() - at:.0f} s ago"


async def _watch(peers: list[SimPeer], activity: Activity, scope: trio.CancelScope, every_s: float) -> None:
    """Progress watchdog: when the trainer has not stepped for `every_s`, say what every peer holds and did last.

    Why: a stall anywhere in the chain (a version not fetched, inference peers holding it but not generating)
    otherwise shows nothing on screen until the time limit. A stall must be impossible to miss, and the peer states
    (versions known and held, connections, last milestone) say where the chain trainer -> policy -> rollouts ->
    votes -> trainer broke.
    """
    with scope:
        last = -1
        while True:
            await trio.sleep(every_s)
            if activity.steps != last:
                last = activity.steps
                continue
            for peer in peers:
                peer.node.events.emit(Stalled(seconds=every_s, last=activity.describe(peer.name),
                                              **_peer_state(peer.node)))


def _peer_state(node: Node) -> dict:
    known = sorted(p.manifest.version for p in node.mirror.policies.values())
    held = [p.manifest.version for p in node.mirror.complete_versions()]
    return {"knows": known[-1] if known else None, "holds": held[-1] if held else None,
            "connected": len(node.connected_peers()), "stopped": node.done.is_set()}


def summarize(events: list[Emitted], extra: dict) -> dict:
    steps = [e.event for e in events if isinstance(e.event, TrainStep)]
    trained = next((e.event for e in events if isinstance(e.event, Trained)), None)
    rejected = [e.event for e in events if isinstance(e.event, RejectedRollout)]
    reasons: dict[str, int] = {}
    for r in rejected:
        key = r.reason.split(":")[0]
        reasons[key] = reasons.get(key, 0) + 1
    return {
        **extra, "steps": len(steps), "rewards": [round(e.reward, 3) for e in steps if e.reward is not None],
        "versions_published": sum(isinstance(e.event, Published) for e in events),
        "policy_copies_completed": sum(isinstance(e.event, Complete) for e in events),
        "groups_generated": sum(e.event.groups for e in events if isinstance(e.event, Generated)),
        "votes_rejecting": len(rejected), "rejection_reasons": reasons,
        "gate": trained.gate if trained else (steps[-1].gate if steps else {}),
        "banned_workers": trained.banned if trained else [], "final_policy": trained.final if trained else None,
        "heldout_accuracy": trained.heldout if trained else {},
        "timeline": timeline(events),  # what report.html draws: steps, evaluations, versions held, bans in time
        "transfer": transfer(events),  # bytes per peer per version against a full copy, seconds per step
    }


def write_report(out: Path, report: dict, events: list[Emitted]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "report.json").write_text(json.dumps(report, indent=1))
    (out / "report.html").write_text(render_html(report))
    with open(out / "events.jsonl", "w") as f:
        for e in events:
            f.write(json.dumps(e.record(), default=str) + "\n")
