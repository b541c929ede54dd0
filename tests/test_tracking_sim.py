"""A simulation with report_to = tensorboard and metrics_port = P: the swarm trainer's steps, gate and held-out
accuracy reach TensorBoard, and every peer of the one process serves its own metrics (trainer P, validator P+1,
worker P+2)."""

from __future__ import annotations

import io
import socket
import threading
import urllib.request

import pytest
import trio

from swarm.cli.main import main
from swarm.event_types import Evaluated, Generated, MetricsListening, TrainStep, Validated
from swarm.events import Emitted, EventSink
from swarm.sim.run import SimSettings, run_sim, summarize
from tests.test_metrics import parse, value


def free_ports(count: int) -> int:
    """The first of `count` consecutive ports that are free now."""
    for _ in range(50):
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            base = sock.getsockname()[1]
        if base + count > 65535:
            continue
        try:
            probes = [socket.socket() for _ in range(count)]
            for i, probe in enumerate(probes):
                probe.bind(("127.0.0.1", base + i))
        except OSError:
            continue
        finally:
            for probe in probes:
                probe.close()
        return base
    raise AssertionError("no run of free ports")


class Scraper(threading.Thread):
    """Scrapes every port whenever a peer reports a milestone (`due`), keeping each port's latest answer. It runs in
    its own thread: the endpoints are served by the simulation's trio loop, which must keep running meanwhile."""

    MILESTONES = (TrainStep, Validated, Generated, Evaluated)

    def __init__(self, ports: list[int]) -> None:
        super().__init__(daemon=True)
        self.ports, self.latest = ports, {}
        self.due, self.stopped = threading.Event(), False

    def on_event(self, emitted: Emitted) -> None:
        if isinstance(emitted.event, self.MILESTONES):
            self.due.set()

    def finish(self) -> None:
        self.stopped = True
        self.due.set()
        self.join(30)

    def run(self) -> None:
        while True:
            self.due.wait()
            self.due.clear()
            if self.stopped:
                return
            for port in self.ports:
                try:
                    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
                        self.latest[port] = parse(response.read().decode())
                except OSError:
                    pass  # already closed: the answer before stands


@pytest.mark.timeout(280)
def test_sim_reports_to_tensorboard_and_each_peer_serves_its_metrics(tmp_path, monkeypatch):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    monkeypatch.setenv("SWARM_MODEL_CACHE", str(tmp_path / "model-cache"))
    base = free_ports(3)
    settings = SimSettings(out=tmp_path, inference=1, validators=1, seeds=0, steps=2, group_size=8,
                           timeout_s=240.0, report_to="tensorboard", metrics_port=base)
    scraper = Scraper([base, base + 1, base + 2])
    sink = EventSink(json_lines=True, stream=io.StringIO())
    events: list[Emitted] = []
    sink.listeners += [events.append, scraper.on_event]
    scraper.start()
    try:
        report = summarize(events, trio.run(run_sim, settings, sink))
    finally:
        scraper.finish()
    assert not report["timed_out"] and report["steps"] == 2
    assert [e.event.url for e in events if isinstance(e.event, MetricsListening)] == [
        f"http://127.0.0.1:{port}/metrics" for port in (base, base + 1, base + 2)]
    tensorboard = EventAccumulator(str(tmp_path / "trainer" / "training" / "tensorboard"))
    tensorboard.Reload()
    assert [e.step for e in tensorboard.Scalars("train/reward")] == [1, 2]
    assert [e.step for e in tensorboard.Scalars("eval/heldout_accuracy")] == [0, 2]
    assert tensorboard.Scalars("swarm/groups_accepted")[-1].value >= 1
    trainer, validator, worker = (scraper.latest[port] for port in (base, base + 1, base + 2))
    assert value(trainer, "rlswarm_gate_groups_total", outcome="accepted", reason="") >= 1
    assert sum(v for (name, _), v in trainer.items() if name == "rlswarm_votes_received_total") >= 1
    assert value(trainer, "rlswarm_trainer_step") >= 0
    assert value(validator, "rlswarm_votes_cast_total") >= 1
    assert value(worker, "rlswarm_generated_rollouts_total") >= 8
    assert value(worker, "rlswarm_generated_tokens_total") >= 8
    assert value(worker, "rlswarm_pieces_verified_total") >= 1  # the worker fetched the trainer's policy
    assert value(trainer, "rlswarm_pieces_total", direction="served") >= 1
    roles = {dict(key[1])["roles"] for m in (trainer, validator, worker) for key in m if key[0] == "rlswarm_peer_info"}
    assert roles == {"trainer", "validator", "inference"}  # one registry per node, though all share one process


def test_sim_refuses_an_unknown_tracker_before_it_starts(tmp_path, capsys):
    assert main(["sim", "--out", str(tmp_path / "sim"), "--report-to", "tensorboard,mlflow"]) == 2
    assert "unknown report_to target 'mlflow'" in capsys.readouterr().err
    assert not (tmp_path / "sim").exists()


def test_sim_refuses_metrics_ports_it_cannot_have_before_it_starts(tmp_path, capsys):
    sim = ["sim", "--out", str(tmp_path / "sim"), "--inference", "1", "--validators", "1", "--seeds", "0",
           "--cheaters", "0"]
    assert main([*sim, "--metrics-port", "65534"]) == 2
    assert "--metrics-port 65534 leaves no room for 3 peers' ports" in capsys.readouterr().err
    base = free_ports(3)  # three free together: only the one taken below can stop the peers' metrics
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", base + 2))
        taken.listen()
        port = taken.getsockname()[1]
        assert main([*sim, "--metrics-port", str(port - 2)]) == 2  # the worker's port (trainer + 2) is taken
    assert f"cannot serve metrics on 127.0.0.1:{port}" in capsys.readouterr().err
    assert not (tmp_path / "sim").exists()
