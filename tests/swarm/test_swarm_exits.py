"""Ctrl-C and SIGTERM on real `swarm` processes: one line, status 130 or 143, and every data directory consistent.

Each test starts the real command on loopback with a temporary data directory, waits (bounded) for the line that
says it is running, sends the signal, and checks the exit status, that stderr holds exactly one line and no
traceback, and that what the command keeps on disk still loads.
"""

from __future__ import annotations

import json
import queue
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import trio

from p2p.host.p2p_host import HostConfig, open_host
from p2p.identity import Identity, load_or_create_identity, read_key_file, write_key_file
from p2p.pieces.store import PieceStore
from swarm.shutdown import is_interrupt

pytestmark = pytest.mark.usefixtures("one_torch_thread")

SWARM = [sys.executable, "-m", "swarm"]
READY_WITHIN_S = 120  # a bound on the start (imports on a busy 2-core machine), not a speed target
EXIT_WITHIN_S = 20  # the SIGTERM guard ends the process after 10 s at the latest
LOOPBACK = ["--listen", "/ip4/127.0.0.1/tcp/0"]
EXPECTED = {signal.SIGINT: (130, "swarm: interrupted"), signal.SIGTERM: (143, "swarm: terminated")}


class Command:
    """A `swarm` child process: its JSON event lines collected by a thread, its stderr kept apart in a file."""

    def __init__(self, tmp_path: Path, *args: str, sigint=signal.SIG_DFL) -> None:
        """sigint: what SIGINT does in the child at its start (SIG_IGN: a background job of a shell script), set
        explicitly so that the tests mean the same when pytest itself runs as such a job."""
        self.stderr_path = tmp_path / "stderr.txt"
        with open(self.stderr_path, "w") as stderr:
            self.popen = subprocess.Popen([*SWARM, *args], stdout=subprocess.PIPE, stderr=stderr, text=True,
                                          cwd=tmp_path, preexec_fn=lambda: signal.signal(signal.SIGINT, sigint))
        self.lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.popen.stdout:
            self.lines.put(line)
        self.lines.put(None)

    def wait_for(self, kind: str) -> dict:
        """The first event of `kind`; fails if the process ends or READY_WITHIN_S passes first."""
        while True:
            try:
                line = self.lines.get(timeout=READY_WITHIN_S)
            except queue.Empty:
                pytest.fail(f"no {kind!r} event within {READY_WITHIN_S} s: {self.stderr()}")
            if line is None:
                pytest.fail(f"the command ended before {kind!r}: {self.stderr()}")
            event = json.loads(line) if line.startswith("{") else {}
            if event.get("event") == kind:
                return event

    def interrupt(self, signum: int) -> tuple[int, str]:
        """Send `signum`; (exit status, stderr) once the process has ended."""
        self.popen.send_signal(signum)
        try:
            status = self.popen.wait(EXIT_WITHIN_S)
        finally:
            self.popen.kill()
        return status, self.stderr()

    def stderr(self) -> str:
        return self.stderr_path.read_text()


def assert_one_line_exit(signum: int, status: int, stderr: str) -> None:
    code, line = EXPECTED[signum]
    assert "Traceback" not in stderr and "ExceptionGroup" not in stderr
    assert stderr.splitlines() == [line] and status == code, (status, stderr)


@pytest.mark.parametrize("signum, sigint", [(signal.SIGINT, signal.SIG_DFL), (signal.SIGTERM, signal.SIG_DFL),
                                             (signal.SIGINT, signal.SIG_IGN), (signal.SIGTERM, signal.SIG_IGN)])
def test_a_peer_ends_on_a_signal_in_one_line_and_its_identity_and_store_still_load(tmp_path, signum, sigint):
    """Also as a background job of a shell script (`nohup swarm peer start &`: SIGINT ignored), which stops on
    SIGINT all the same."""
    data = tmp_path / "peer"
    peer = Command(tmp_path, "peer", "start", "--json-events", "--data-dir", str(data), *LOOPBACK, sigint=sigint)
    listening = peer.wait_for("listening")
    assert_one_line_exit(signum, *peer.interrupt(signum))
    assert load_or_create_identity(data).peer_id == listening["peer_id"]  # the same key, not a new one
    with PieceStore(data / "store"):  # opens (its lock was released with the process)
        pass


def test_an_interrupt_inside_an_open_host_reaches_its_caller():
    """In-process, without the signal: a KeyboardInterrupt raised while a host is open leaves `open_host` as an
    interrupt. Why: closing the host closes its reachability service, whose close awaits; were the host's tasks
    cancelled first, a Cancelled from that await would replace the interrupt and the host's own cancel scope would
    swallow it, and an interrupted peer would end as if its work were done."""

    async def interrupted_host() -> None:
        async with open_host(HostConfig(listen=("/ip4/127.0.0.1/tcp/0",))):
            raise KeyboardInterrupt

    with pytest.raises(BaseException) as caught:
        trio.run(interrupted_host)
    assert is_interrupt(caught.value), repr(caught.value)


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_status_ends_on_a_signal_in_one_line_while_it_joins_the_swarm(tmp_path, signum):
    """The bootstrap peer is a plain socket of the test: once `swarm status` has dialled it, it waits inside
    trio for a handshake that never comes, and the signal arrives there."""
    with socket.socket() as bootstrap:
        bootstrap.bind(("127.0.0.1", 0))
        bootstrap.listen()
        bootstrap.settimeout(READY_WITHIN_S)
        address = f"/ip4/127.0.0.1/tcp/{bootstrap.getsockname()[1]}/p2p/{Identity.generate().peer_id}"
        status = Command(tmp_path, "status", "--run", "r", "--bootstrap", address, "--seconds", "300")
        connection, _ = bootstrap.accept()
        with connection:
            assert_one_line_exit(signum, *status.interrupt(signum))


def write_trained_policy(tiny, directory: Path) -> Path:
    """OUT/final exactly as `swarm train` writes it (trainer.checkpoint.publish_policy with FastCuRL's settings,
    whose stage is a name such as "all@6")."""
    from trainer.checkpoint import publish_policy
    from trainer.curriculum import fastcurl

    generation = fastcurl(total_steps=8, max_new_tokens=6, group_size=2).generation_settings(2, 0.6)
    assert not str(generation["stage"]).isdigit()
    return publish_policy(directory, tiny.model, tiny.tokenizer, tiny.description, generation)


def start_publish(tmp_path: Path, policy: Path) -> tuple[Command, Path]:
    key = tmp_path / "run.key"
    write_key_file(key, Identity.generate())
    publisher = Command(tmp_path, "publish", str(policy), "--run", "r", "--key", str(key), "--json-events",
                        "--data-dir", str(tmp_path / "publisher"), *LOOPBACK)
    return publisher, key


def published_manifests(data_dir: Path) -> list:
    with PieceStore(data_dir / "store") as store:
        return store.manifests()


def test_publish_takes_what_swarm_train_writes_and_ends_on_sigterm(tmp_path, tiny):
    final = write_trained_policy(tiny, tmp_path / "out" / "final")
    publisher, key = start_publish(tmp_path, final)
    published = publisher.wait_for("published")
    assert_one_line_exit(signal.SIGTERM, *publisher.interrupt(signal.SIGTERM))
    read_key_file(key)
    [manifest] = published_manifests(tmp_path / "publisher")
    assert manifest.id.hex() == published["id"] and manifest.version == 1
    assert manifest.generation.stage == 1 and manifest.generation.max_new_tokens == 6  # FastCuRL's "all@6"
    assert manifest.model == json.loads((final / "model.json").read_text())


def test_publish_takes_a_plain_hugging_face_directory_without_writing_into_it(tmp_path, tiny):
    from inference.models import tokenizer_id

    hub = tmp_path / "hf-model"
    tiny.model.save_pretrained(hub)
    tiny.tokenizer.save_pretrained(hub)
    before = {path.name: path.read_bytes() for path in hub.iterdir()}
    assert "model.json" not in before
    publisher, _ = start_publish(tmp_path, hub)
    publisher.wait_for("published")
    assert_one_line_exit(signal.SIGINT, *publisher.interrupt(signal.SIGINT))
    assert {path.name: path.read_bytes() for path in hub.iterdir()} == before
    [manifest] = published_manifests(tmp_path / "publisher")
    assert manifest.model["tokenizer_id"] == tokenizer_id(hub)
    assert manifest.model["eos_token_ids"] == tiny.description["eos_token_ids"]
    assert manifest.model["architecture"]["num_hidden_layers"] == 2
    assert [entry.name for entry in manifest.files] == ["model.safetensors"]


def test_a_hugging_face_directory_is_described_as_loading_it_describes_it(tmp_path, tiny):
    """What publish writes from the files alone equals what loading the model says of itself."""
    from inference.models import describe_files, load_model

    hub = tmp_path / "hf-model"
    tiny.model.save_pretrained(hub)
    tiny.tokenizer.save_pretrained(hub)
    described, loaded = describe_files(hub), load_model(str(hub)).description
    assert {k: described[k] for k in ("name", "tokenizer_id", "eos_token_ids")} == \
           {k: loaded[k] for k in ("name", "tokenizer_id", "eos_token_ids")}


def test_sigterm_becomes_a_keyboard_interrupt_and_a_guard_bounds_the_unwind(monkeypatch):
    """Outside trio the handler is Python's own; the guard's line is the one line when the unwind hangs."""
    from swarm.shutdown import Interrupts, is_interrupt

    monkeypatch.setattr(signal, "getsignal", lambda signum: signal.default_int_handler)
    exits: list[int] = []
    interrupts = Interrupts(grace_s=0.0, exit_process=exits.append)
    with pytest.raises(KeyboardInterrupt):
        interrupts.on_terminate(signal.SIGTERM, None)
    interrupts.guard._timer.join(10)
    assert exits == [143] and interrupts.status() == 143
    assert interrupts.guard.message == "swarm: terminated (still closing after 0 s; exiting anyway)"
    assert is_interrupt(BaseExceptionGroup("peer", [ExceptionGroup("host", [OSError()]),
                                                    BaseExceptionGroup("role", [KeyboardInterrupt()])]))
    assert not is_interrupt(ExceptionGroup("peer", [OSError()]))
    assert Interrupts().status() == 130 and Interrupts().line() == "swarm: interrupted"


def test_a_background_job_takes_sigint_back_with_pythons_handler_for_trio_to_replace():
    """A job started with SIGINT ignored (`nohup swarm ... &`) still stops on SIGINT: for the command's time its
    handler is Python's, which trio.run replaces with its own (with SIGINT ignored trio installs none, and a
    KeyboardInterrupt raised straight from the SIGTERM handler could land inside trio's run loop)."""
    from swarm.shutdown import Interrupts

    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        with Interrupts().installed():
            assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
            assert signal.SIGINT not in signal.pthread_sigmask(signal.SIG_BLOCK, [])
            assert signal.getsignal(signal.SIGTERM) != signal.SIG_DFL
        assert signal.getsignal(signal.SIGINT) == signal.SIG_IGN
        assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL
    finally:
        signal.signal(signal.SIGINT, previous)


def test_eval_takes_the_task_from_its_config(tmp_path, tiny, monkeypatch, capsys):
    """In-process (`swarm eval` as the command runs it, minus a second interpreter's start): what is read from the
    config file is what the result reports."""
    from swarm.cli.main import main

    config = tmp_path / "gcd.toml"
    config.write_text('model = "tiny"\ntask = "gcd"\ntask_config = {max_value = 50}\ntask_size = 16\nseed = 3\n')
    monkeypatch.setenv("SWARM_MODEL_CACHE", str(Path(tiny.directory).parent))
    status = main(["eval", "--config", str(config), "--n", "1", "--max-new-tokens", "1", "--json"])
    captured = capsys.readouterr()
    assert status == 0, captured.err
    out = json.loads(captured.out)
    assert out["task"] == "gcd" and out["seed"] == 3 and out["model"] == "tiny" and out["n"] == 1
