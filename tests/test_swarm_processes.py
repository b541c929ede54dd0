"""The deployment the README describes, for real: trainer, validator and inference peer as separate OS processes.

`swarm sim` runs every peer in one process; users run one peer per process, each with its own torch, joined through
the trainer's printed multiaddr and trusting the run key given on the command line. This test is that flow, end to
end: the trainer steps only on rollouts its validator accepted, publishes each version, and exits when trained.
"""

from __future__ import annotations

import json
import queue
import subprocess
import sys
import threading
import time

from p2p.identity import Identity, write_key_file

SWARM = [sys.executable, "-m", "swarm"]
TRAINER_TOML = """\
model = "tiny"
task = "gcd"
task_config = {max_value = 50}
task_size = 64
curriculum = "none"
steps = 2
steps_per_policy = 1
prompts_per_step = 4
group_size = 4
max_new_tokens = 4
temperature = 1.0
lr = 3e-3
eval_every = 0
checkpoint_every = 1000
threads = 1
"""


class Peer:
    """One `swarm peer start --json-events` process; a thread drains its stdout so every wait below is bounded."""

    def __init__(self, *args: str) -> None:
        self.proc = subprocess.Popen([*SWARM, "peer", "start", "--json-events", *args], stdout=subprocess.PIPE,
                                     stderr=subprocess.DEVNULL, text=True)
        self.events: list[dict] = []
        self._new: queue.Queue = queue.Queue()
        threading.Thread(target=self._drain, daemon=True).start()

    def _drain(self) -> None:
        for line in self.proc.stdout:
            try:
                self._new.put(json.loads(line))
            except ValueError:
                continue

    def wait_for(self, kind: str, deadline: float) -> dict:
        while (left := deadline - time.monotonic()) > 0:
            try:
                event = self._new.get(timeout=left)
            except queue.Empty:
                break
            self.events.append(event)
            if event["event"] == kind:
                return event
        raise AssertionError(f"no {kind!r} event; last events: {[e['event'] for e in self.events[-8:]]}")

    def collect(self) -> list[dict]:
        while not self._new.empty():
            self.events.append(self._new.get_nowait())
        return self.events

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)


def test_trainer_validator_and_inference_processes_train_on_accepted_rollouts(tmp_path):
    key = Identity.generate()
    write_key_file(tmp_path / "run.key", key)
    (tmp_path / "trainer.toml").write_text(TRAINER_TOML)
    common = ["--run", "mp", "--listen", "/ip4/127.0.0.1/tcp/0"]
    peers: list[Peer] = []
    try:
        deadline = time.monotonic() + 240
        trainer = Peer("--role", "trainer", "--role", "seed", *common, "--trainer-config", str(tmp_path / "trainer.toml"),
                       "--key", str(tmp_path / "run.key"), "--data-dir", str(tmp_path / "trainer"), "--replicas", "1",
                       "--quorum", "1", "--prompts-per-worker", "4", "--exit-when-trained")
        peers.append(trainer)
        address = trainer.wait_for("listening", deadline)["addrs"][0]
        joined = ["--bootstrap", address, "--trainer-key", key.public_bytes.hex(), "--model", "tiny"]
        validator = Peer("--role", "validator", *common, *joined, "--data-dir", str(tmp_path / "validator"))
        worker = Peer("--role", "inference", *common, *joined, "--data-dir", str(tmp_path / "worker"))
        peers += [validator, worker]
        trained = trainer.wait_for("trained", deadline)
        assert trainer.proc.wait(30) == 0  # --exit-when-trained: a clean exit once the final policy is saved
        worker_id = worker.wait_for("listening", deadline)["peer_id"]
        steps = [e for e in trainer.collect() if e["event"] == "train_step"]
        published = [e["version"] for e in trainer.events if e["event"] == "published"]
    finally:
        for peer in peers:
            peer.stop()
    assert trained["steps"] == 2 and len(steps) == 2 and published == [0, 1, 2]
    assert all(s["groups"] == 4 and s["workers"] == [worker_id] for s in steps)  # only quorum-accepted groups
    votes = [e for e in validator.collect() if e["event"] == "validated"]
    assert votes and votes[-1]["accepted"] >= 8 and votes[-1]["rejected"] == 0
    assert any(e["event"] == "generated" and e["groups"] == 4 for e in worker.collect())
