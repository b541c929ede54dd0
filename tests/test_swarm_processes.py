"""The deployment of docs/operations.md, for real: trainer, validator and inference peer as separate OS processes.

`swarm sim` runs every peer in one process; users run one peer per process, each with its own torch, joined through
the trainer's printed multiaddr and trusting the run key given on the command line. This test is that flow, end to
end: the trainer steps only on rollouts its validator accepted, publishes each version, and exits when trained.
"""

from __future__ import annotations

import json
import socket
import time

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


def start_validator_and_worker(tmp_path, trainer: EventProcess, key: Identity, deadline: float):
    """A validator and an inference peer joined through the trainer's printed multiaddr, trusting the run key."""
    address = trainer.wait_for("listening", deadline)["addrs"][0]
    joined = ["--bootstrap", address, "--trainer-key", key.public_bytes.hex(), "--model", "tiny"]
    return (start_peer(tmp_path, "validator", "--role", "validator", *joined),
            start_peer(tmp_path, "worker", "--role", "inference", *joined))


def named_validator(trainer_dir, validators: list[EventProcess], deadline: float) -> tuple[str, int]:
    """(peer id, index) of the last of `validators` that the trainer's first version names in its run spec."""
    spec = json.loads((trainer_dir / "swarm-policies" / "v0" / "model.json").read_text())["run_spec"]
    ids = [v.wait_for("listening", deadline)["peer_id"] for v in validators]
    index = max(i for i, peer in enumerate(ids) if public_bytes_from_peer_id(peer).hex() in spec["validators"])
    return ids[index], index


def test_a_run_survives_a_validator_that_leaves_for_good(tmp_path):
    """Three validators (replicas 2, quorum 2), one killed once the first version names it and before any worker
    joins: its peers forget it once its heartbeats stop, the rollouts that waited on its vote time out at once
    (blaming no worker), a version naming only those still there goes out at once, and training ends. Before, a
    departed validator stayed in every version's validator set and held each of its rollouts for the whole quorum
    timeout.

    The one killed is one that the first version names: usually all three, but the trainer publishes it as soon as
    `replicas` validators are heard, and on a loaded machine the third can start later than that.

    Why kill it before the worker starts: then it voted on nothing, and a step can pass without its departure
    being noticed only if every one of that step's four groups was assigned to the other two ((1/3)^4 for each
    step). Killed after the first step, it had often voted on the second step's groups already, and on a fast
    machine the run ended before its silence was noticed."""
    key = Identity.generate()
    write_key_file(tmp_path / "run.key", key)
    (tmp_path / "trainer.toml").write_text(TRAINER_TOML + "async_level = 1\n")  # a republish keeps ready groups
    (tmp_path / "peer.toml").write_text("[peer]\nstatus_every_s = 1.0\nheartbeat_every_s = 1.0\npeer_silence_s = 8.0\n")
    fast = ["--config", str(tmp_path / "peer.toml")]
    peers: list[EventProcess] = []
    try:
        deadline = time.monotonic() + 300
        trainer = start_peer(tmp_path, "trainer", "--role", "trainer", "--role", "seed", "--trainer-config",
                             str(tmp_path / "trainer.toml"), "--key", str(tmp_path / "run.key"), "--replicas", "2",
                             "--quorum", "2", "--prompts-per-worker", "4", "--exit-when-trained", *fast)
        peers.append(trainer)
        address = trainer.wait_for("listening", deadline)["addrs"][0]
        joined = ["--bootstrap", address, "--trainer-key", key.public_bytes.hex(), "--model", "tiny", *fast]
        validators = [start_peer(tmp_path, f"validator{i}", "--role", "validator", *joined) for i in range(3)]
        peers += validators
        named = trainer.wait_for("published", deadline, version=0)["validators"]
        leaving, index = named_validator(tmp_path / "trainer", validators, deadline)
        validators[index].popen.kill()
        peers.append(start_peer(tmp_path, "worker", "--role", "inference", *joined))
        gone = trainer.wait_for("peer_gone", deadline, peer=leaving)
        trained = trainer.wait_for("trained", deadline)
    finally:
        for peer in peers:
            peer.stop()
    assert named >= 2 and trained["steps"] == 2 and trained["banned"] == []
    assert gone["roles"] == ["validator"]
    assert trained["gate"].get("rejected", 0) == 0  # nothing honest was blamed for the missing votes
    after = [e["validators"] for e in trainer.events("published") if e["t"] > gone["t"]]
    assert after and set(after) == {2}  # every version since names only the validators still there


def test_a_trainer_killed_mid_run_restarts_on_its_address_and_finishes_on_rows_only_it_holds(tmp_path):
    """On a user dataset that only the trainer's machine holds: it travels with every policy version, and the worker
    and the validator read the trainer's rows from their own verified copy (the original is removed once the first
    version is out and returned only for the restart). SIGKILL after the first step (its checkpoint is written
    before the step is reported), then the same command again: the trainer resumes from the checkpoint, sends its
    weights out under a version number past every one it announced before, and the validator and worker that never
    stopped answer it until the run is trained, on quorum-accepted groups only, one version per step."""
    key = Identity.generate()
    write_key_file(tmp_path / "run.key", key)
    dataset = tmp_path / "trainer-only" / "sums.jsonl"
    dataset.parent.mkdir()
    dataset.write_text("".join(json.dumps({"prompt": f"What is {a} + {b}? Answer with the number only.",
                                           "answer": str(a + b)}) + "\n" for a in range(8) for b in range(8)))
    (tmp_path / "trainer.toml").write_text(TRAINER_TOML.replace('task = "gcd"', f'task = "{dataset}"')
                                           .replace("steps = 2", "steps = 3")
                                           .replace("checkpoint_every = 1000", "checkpoint_every = 1"))
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        listen = f"/ip4/127.0.0.1/tcp/{probe.getsockname()[1]}"
    trainer_flags = ["--role", "trainer", "--role", "seed", "--trainer-config", str(tmp_path / "trainer.toml"),
                     "--key", str(tmp_path / "run.key"), "--replicas", "1", "--quorum", "1",
                     "--prompts-per-worker", "4", "--exit-when-trained"]
    peers: list[EventProcess] = []
    try:
        deadline = time.monotonic() + 360
        first = start_peer(tmp_path, "trainer", *trainer_flags, listen=listen, log="trainer-1")
        peers.append(first)
        validator, worker = start_validator_and_worker(tmp_path, first, key, deadline)
        peers += [validator, worker]
        first.wait_for("published", deadline, version=0)
        rows = dataset.read_bytes()
        dataset.unlink()  # until the restart only the copies that travel with the policies exist
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
        votes = validator.wait_for("validated", deadline)
    finally:
        for peer in peers:
            peer.stop()
    assert again.wait_for("listening", deadline)["addrs"] == first.wait_for("listening", deadline)["addrs"]
    announced_before = [e["version"] for e in first.events("published")]
    assert announced_before == list(range(len(announced_before)))  # one version per step
    assert resumed["step"] >= 1 and resumed["version"] > max(announced_before)
    steps = again.events("train_step")
    # 0-based step numbers
    assert trained["steps"] == 3 and [e["step"] for e in steps] == list(range(resumed["step"], 3))
    assert [e["version"] for e in again.events("published")] == [resumed["version"]] + [s["version"] for s in steps]
    for step in first.events("train_step") + steps:  # only quorum-accepted groups of the one worker
        assert step["groups"] == 4 and step["workers"] == [worker_id], step
    assert votes["accepted"] >= 4 and votes["rejected"] == 0
    assert all(e["groups"] == 4 for e in worker.events("generated"))
    assert not worker.events("skipped") and not validator.events("skipped")
    assert not any(p.events("role_failed") for p in peers)
    for peer in ("worker", "validator"):
        copies = list((tmp_path / peer / "policies").glob("v*/sums.jsonl"))
        assert copies and all(c.read_bytes() == rows for c in copies)
