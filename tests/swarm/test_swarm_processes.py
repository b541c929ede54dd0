"""The deployment of docs/operations.md, for real: trainer, validator and inference peer as separate OS processes.

`swarm sim` runs every peer in one process; users run one peer per process, each with its own torch, joined through
the trainer's printed multiaddr and trusting the run key given on the command line. This test is that flow, end to
end: the trainer steps only on rollouts its validator accepted, publishes each version, and exits when trained.
"""

from __future__ import annotations

import json
import socket
import subprocess
import time

import pytest

from p2p.identity import Identity, public_bytes_from_peer_id, write_key_file
from swarm.bench.broadcast import EventProcess

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


def start_peer(tmp_path, name: str, *flags: str, listen: str = "/ip4/127.0.0.1/tcp/0", log: str = "") -> EventProcess:
    """`swarm peer start --json-events` as its own process; its stderr goes to tmp_path/NAME.log (or LOG.log)."""
    argv = ["-m", "swarm", "peer", "start", "--json-events", "--run", "mp", "--listen", listen,
            "--data-dir", str(tmp_path / name), *flags]
    return EventProcess(argv, tmp_path / f"{log or name}.log")


def free_loopback_address() -> str:
    """A loopback multiaddr on a port free now: the trainer listens there in both of its lives, and the other peers
    can be given its address before it runs."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return f"/ip4/127.0.0.1/tcp/{probe.getsockname()[1]}"


def stop_all(peers: list[EventProcess]) -> None:
    """SIGTERM to every peer first, then wait for each: they shut down side by side, not one after another."""
    for peer in peers:
        if peer.popen.poll() is None:
            peer.popen.terminate()
    for peer in peers:
        try:
            peer.popen.wait(10)
        except subprocess.TimeoutExpired:
            peer.popen.kill()
        peer.stop()


def named_validator(trainer_dir, validators: list[EventProcess], deadline: float) -> tuple[str, int]:
    """(peer id, index) of the last of `validators` that the trainer's first version names in its run spec."""
    spec = json.loads((trainer_dir / "swarm-policies" / "v0" / "model.json").read_text())["run_spec"]
    ids = [v.wait_for("listening", deadline)["peer_id"] for v in validators]
    index = max(i for i, peer in enumerate(ids) if public_bytes_from_peer_id(peer).hex() in spec["validators"])
    return ids[index], index


@pytest.mark.timeout(480)  # two trainer lives in one run: past the suite's 300 s on a loaded machine
def test_a_run_survives_a_validator_that_leaves_for_good_and_a_trainer_killed_mid_run_restarting_on_its_address(
        tmp_path):
    """One swarm shows both: a validator that leaves for good, then a trainer killed mid-run that restarts.

    A validator that leaves: three validators (replicas 2, quorum 2), one killed the moment the first version names
    it, before any rollout of that version could reach it: the trainer forgets it once its heartbeats stop, the
    rollouts that waited on its vote time out at once (blaming no worker), a version naming only those still there
    goes out at once, and training goes on. Before, a departed validator stayed in every version's validator set
    and held each of its rollouts for the whole quorum timeout. The one killed is one that the first version names:
    usually all three, but the trainer publishes it as soon as `replicas` validators are heard, and on a loaded
    machine the third can start later than that.

    A trainer that restarts: on a user dataset that only the trainer's machine holds, the dataset travels with every
    policy version, and the worker and the validators read the trainer's rows from their own verified copy (the
    original is removed once the first version is out and returned only for the restart). SIGKILL once it has
    stepped and published past the departure (its checkpoint is written before the step is reported), then the
    same command again: the trainer resumes from the checkpoint, sends its weights out under a version number past
    every one it announced before, and the validators and worker that never stopped answer it until the run is
    trained, on quorum-accepted groups only, one version per step.

    Every peer starts at once: the trainer's address (a port free now, and its peer id, which is the run key's) is
    known before it runs, and the others redial it every second until it answers."""
    key = Identity.generate()
    write_key_file(tmp_path / "run.key", key)
    dataset = tmp_path / "trainer-only" / "sums.jsonl"
    dataset.parent.mkdir()
    dataset.write_text("".join(json.dumps({"prompt": f"What is {a} + {b}? Answer with the number only.",
                                           "answer": str(a + b)}) + "\n" for a in range(8) for b in range(8)))
    (tmp_path / "trainer.toml").write_text(TRAINER_TOML.replace('task = "gcd"', f'task = "{dataset}"')
                                           .replace("checkpoint_every = 1000", "checkpoint_every = 1")
                                           + "async_level = 1\n")  # a republish keeps ready groups
    (tmp_path / "peer.toml").write_text("[peer]\nstatus_every_s = 1.0\nheartbeat_every_s = 1.0\npeer_silence_s = 8.0\n"
                                        "bootstrap_redial_s = 1.0\n")
    fast = ["--config", str(tmp_path / "peer.toml")]
    listen = free_loopback_address()
    trainer_flags = ["--role", "trainer", "--role", "seed", "--trainer-config", str(tmp_path / "trainer.toml"),
                     "--key", str(tmp_path / "run.key"), "--replicas", "2", "--quorum", "2",
                     "--prompts-per-worker", "4", "--exit-when-trained", *fast]
    joined = ["--bootstrap", f"{listen}/p2p/{key.peer_id}", "--trainer-key", key.public_bytes.hex(), "--model",
              "tiny", *fast]
    peers: list[EventProcess] = []
    try:
        deadline = time.monotonic() + 420
        first = start_peer(tmp_path, "trainer", *trainer_flags, listen=listen, log="trainer-1")
        validators = [start_peer(tmp_path, f"validator{i}", "--role", "validator", *joined) for i in range(3)]
        worker = start_peer(tmp_path, "worker", "--role", "inference", *joined)
        peers += [first, *validators, worker]
        named = first.wait_for("published", deadline, version=0)["validators"]
        leaving, index = named_validator(tmp_path / "trainer", validators, deadline)
        validators[index].popen.kill()
        rows = dataset.read_bytes()
        dataset.unlink()  # until the restart only the copies that travel with the policies exist
        gone = first.wait_for("peer_gone", deadline, peer=leaving)
        first.wait_for("published", deadline, after=gone["t"])  # a version naming only those still there
        first.wait_for("train_step", deadline)
        first.popen.kill()
        first.popen.wait(30)
        dataset.write_bytes(rows)  # the trainer's machine holds its file again for the same command
        again = start_peer(tmp_path, "trainer", *trainer_flags, listen=listen, log="trainer-2")
        peers.append(again)
        resumed = again.wait_for("resumed", deadline)
        trained = again.wait_for("trained", deadline)
        assert again.popen.wait(30) == 0  # --exit-when-trained: a clean exit once the final policy is saved
        worker_id = worker.wait_for("listening", deadline)["peer_id"]
    finally:
        stop_all(peers)
    staying = [v for i, v in enumerate(validators) if i != index]
    _assert_the_validator_left_for_good(first, again, named, gone, trained)
    _assert_the_trainer_resumed_and_finished(first, again, resumed, trained, worker, worker_id, staying)
    assert not any(p.events("role_failed") for p in peers)
    for peer in ("worker", *(f"validator{i}" for i in range(3) if i != index)):
        copies = list((tmp_path / peer / "policies").glob("v*/sums.jsonl"))
        assert copies and all(c.read_bytes() == rows for c in copies), peer


def _assert_the_validator_left_for_good(first: EventProcess, again: EventProcess, named: int, gone: dict,
                                        trained: dict) -> None:
    assert named >= 2 and gone["roles"] == ["validator"] and trained["banned"] == []
    steps = first.events("train_step") + again.events("train_step")
    assert all(s["gate"].get("rejected", 0) == 0 for s in steps)  # nothing honest was blamed for missing votes
    assert trained["gate"].get("rejected", 0) == 0
    before_restart = [e["validators"] for e in first.events("published") if e["t"] > gone["t"]]
    assert before_restart and set(before_restart) == {2}  # at once, before the trainer was killed
    assert {e["validators"] for e in again.events("published")} == {2}  # every version since names those still there


def _assert_the_trainer_resumed_and_finished(first: EventProcess, again: EventProcess, resumed: dict, trained: dict,
                                             worker: EventProcess, worker_id: str,
                                             validators: list[EventProcess]) -> None:
    assert again.events("listening")[0]["addrs"] == first.events("listening")[0]["addrs"]
    announced_before = [e["version"] for e in first.events("published")]
    assert announced_before == list(range(len(announced_before)))  # numbered one after another
    assert resumed["step"] >= 1 and resumed["version"] > max(announced_before)
    steps = again.events("train_step")
    # 0-based step numbers
    assert trained["steps"] == 2 and [e["step"] for e in steps] == list(range(resumed["step"], 2))
    assert [e["version"] for e in again.events("published")] == [resumed["version"]] + [s["version"] for s in steps]
    for step in first.events("train_step") + steps:  # only quorum-accepted groups of the one worker
        assert step["groups"] == 4 and step["workers"] == [worker_id], step
    for validator in validators:
        votes = validator.events("validated")[-1]
        assert votes["accepted"] >= 4 and votes["rejected"] == 0, votes
    assert all(e["groups"] == 4 for e in worker.events("generated"))
    assert not worker.events("skipped") and not any(v.events("skipped") for v in validators)
