"""Whole peers on loopback: publish -> fetch -> the seed leaves -> a late peer completes from re-seeders."""

from __future__ import annotations

import functools
import json
import subprocess
import sys
import time
from pathlib import Path

import blake3
import numpy as np
import pytest
import trio
from safetensors.numpy import load_file, save_file

from p2p.identity import Identity, write_key_file
from p2p.pieces.manifest import GenerationSettings, build_manifest, sign_manifest
from swarm.config import load_config
from swarm.events import EventSink
from swarm.node import node as node_module
from swarm.node.node import open_node_parts


def make_checkpoint(path: Path, floats: int = 300_000) -> bytes:
    path.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(1)
    save_file({"a": rng.standard_normal(floats).astype(np.float32), "b": np.arange(1000, dtype=np.int64)},
              str(path / "model.safetensors"))
    (path / "model.json").write_text(json.dumps({"architecture": "test"}))
    return (path / "model.safetensors").read_bytes()


def signed_checkpoint(tmp_path: Path, trainer: Identity, version: int = 1, floats: int = 300_000):
    """A checkpoint in tmp_path/ckpt, its manifest as `version` of run "t" and the trainer's signed bytes."""
    original = make_checkpoint(tmp_path / "ckpt", floats)
    manifest = build_manifest(tmp_path / "ckpt", run="t", version=version,
                              parent_version=version - 1 if version > 1 else None, created_at=0.0,
                              generation=GenerationSettings(4, 0.6, 64, 0), piece_size=256 * 1024)
    return original, manifest, sign_manifest(manifest, trainer.sign, trainer.public_bytes).to_bytes()


class Peer:
    """One in-process peer; `node` is set once it runs, `stop()` ends it."""

    def __init__(self, tmp: Path, name: str, trainer: Identity, bootstrap=(), identity=None, reseed=True, **config):
        self.config = load_config(
            None,
            {
                "run": "t",
                "data_dir": tmp / name,
                "bootstrap": tuple(bootstrap),
                "trainer_key": trainer.public_bytes.hex(),
                "reseed": reseed,
                "bootstrap_file": tmp / "none.txt",
                "status_every_s": 0.5,
                "heartbeat_every_s": 0.5,
                "peer_silence_s": 1.5,
                "bootstrap_redial_s": 0.5,
                **config,
            },
        )
        self.identity = identity or Identity.generate()
        self.trainer = trainer
        self.node = None
        self.ready = trio.Event()
        self.finished = trio.Event()
        self.events: list[dict] = []

    async def run(self, extra_roles=()):
        async def capture(node):
            self.node = node
            self.ready.set()

        sink = EventSink(json_lines=False, stream=open("/dev/null", "w"))
        sink.listeners.append(lambda e: self.events.append(e.record()))
        try:
            await open_node_parts(self.config, self.identity, sink, [capture, *extra_roles], self.trainer.public_bytes)
        finally:
            self.finished.set()

    def stop(self):
        self.node.done.set()

    async def wait_complete(self, manifest_id: bytes):
        while True:
            policy = self.node.mirror.policies.get(manifest_id)
            if policy is not None and policy.service.completed.is_set():
                return policy
            await self.node.mirror.changed.wait()


async def start_seeding(nursery, tmp_path: Path, trainer: Identity, signed) -> Peer:
    """The trainer's own peer, up and serving `signed` (the checkpoint signed_checkpoint wrote under tmp_path/ckpt)."""
    seed = Peer(tmp_path, "seed", trainer, identity=trainer)
    nursery.start_soon(seed.run)
    await seed.ready.wait()
    seed.node.mirror.adopt(signed, local_dir=tmp_path / "ckpt")
    return seed


async def test_publish_fetch_seed_leaves_late_peer_completes(tmp_path):
    trainer = Identity.generate()
    original, manifest, signed = signed_checkpoint(tmp_path, trainer)
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            seed = await start_seeding(nursery, tmp_path, trainer, signed)
            first = Peer(tmp_path, "first", trainer, bootstrap=[seed.node.host.multiaddrs[0]])
            nursery.start_soon(first.run)
            await first.ready.wait()
            await first.wait_complete(manifest.id)
            first_addr = first.node.host.multiaddrs[0]
            seed_id = seed.node.peer_id
            while seed_id not in first.node.peer_roles:  # the fetch can outrun the seed's first heartbeat heard
                await trio.sleep(0.05)
            seed.stop()  # the origin leaves; only the first peer holds the policy now
            late = Peer(tmp_path, "late", trainer, bootstrap=[first_addr])
            nursery.start_soon(late.run)
            await late.ready.wait()
            policy = await late.wait_complete(manifest.id)
            out = late.node.mirror.store.reassemble(policy.manifest, tmp_path / "late-out")
            while not any(e["event"] == "peer_gone" and e["peer"] == seed_id for e in first.events):
                await trio.sleep(0.1)  # heartbeats stopped with the seed: it is forgotten within peer_silence_s
            assert seed_id not in first.node.peer_roles and late.node.peer_id in first.node.peer_roles
            first.stop()
            late.stop()
    assert (out / "model.safetensors").read_bytes() == original
    assert load_file(str(out / "model.safetensors"))["b"].tolist() == list(range(1000))


async def test_a_peer_serving_corrupt_pieces_is_dropped_banned_and_reported_and_the_policy_completes(tmp_path):
    """Real hosts: the only holder at first lies about every piece. The fetcher reports it in one event, never
    links it again (each new link would cost a piece), and completes from the
    honest seed that comes later."""
    trainer = Identity.generate()
    original, manifest, signed = signed_checkpoint(tmp_path, trainer)
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            liar = Peer(tmp_path, "liar", trainer)
            nursery.start_soon(liar.run)
            await liar.ready.wait()
            store = liar.node.mirror.store
            honest_read = store.read_piece
            store.read_piece = lambda m, i: bytes(b ^ 0x5A for b in honest_read(m, i))
            liar.node.mirror.adopt(signed, local_dir=tmp_path / "ckpt")
            fetcher = Peer(tmp_path, "fetcher", trainer, bootstrap=[liar.node.host.multiaddrs[0]])
            nursery.start_soon(fetcher.run)
            await fetcher.ready.wait()
            liar_id = liar.node.peer_id
            while not any(e["event"] == "peer_dropped" for e in fetcher.events):
                await trio.sleep(0.05)
            banned_at = len(fetcher.events)
            seed = await start_seeding(nursery, tmp_path, trainer, signed)
            nursery.start_soon(_connect, fetcher, seed)
            policy = await fetcher.wait_complete(manifest.id)
            out = fetcher.node.mirror.store.reassemble(policy.manifest, tmp_path / "out")
            for peer in (liar, fetcher, seed):
                peer.stop()
    (dropped,) = [e for e in fetcher.events if e["event"] == "peer_dropped"]
    assert dropped["dropped"] == liar_id and dropped["banned"] and dropped["reason"].startswith("sent a corrupt piece")
    assert liar_id in fetcher.node.mirror.banned
    assert not any(e["event"] == "link" and e["peer"] == liar_id for e in fetcher.events[banned_at:])
    assert (out / "model.safetensors").read_bytes() == original


@pytest.fixture
def dht_asked_every_second(monkeypatch):
    """Peers that hold no policy ask the DHT for the run's latest manifest every second instead of every ten: the
    same lookups, sooner, so a test of what the DHT alone delivers does not sit out the product's interval."""
    find_latest = node_module._find_latest_on_dht
    monkeypatch.setattr(node_module, "_find_latest_on_dht",
                        functools.update_wrapper(functools.partial(find_latest, every_s=1.0), find_latest))


@pytest.mark.usefixtures("dht_asked_every_second")
async def test_a_peer_that_missed_every_announcement_finds_the_newest_policy_through_the_dht(tmp_path):
    """The joiner's only contact is a peer of another run (no gossip of this run reaches it). The trainer's peer
    announced its version before the joiner came, sends no heartbeats and dials no data channel, so the DHT's
    signed latest-manifest record and its provider records are the joiner's only way to the policy."""
    trainer = Identity.generate()
    _, manifest, signed = signed_checkpoint(tmp_path, trainer)
    with trio.fail_after(90):
        async with trio.open_nursery() as nursery:
            relay = Peer(tmp_path, "relay", trainer, run="another-run")
            nursery.start_soon(relay.run)
            await relay.ready.wait()
            relay_addr = relay.node.host.multiaddrs[0]
            seed = Peer(tmp_path, "seed", trainer, identity=trainer, bootstrap=[relay_addr], max_peers=0,
                        heartbeat_every_s=1000.0, peer_silence_s=3000.0)
            nursery.start_soon(seed.run)
            await seed.ready.wait()
            seed.node.mirror.adopt(signed, local_dir=tmp_path / "ckpt")
            await seed.node.announce_policy(signed, manifest)
            await trio.sleep(4)  # past the gossip window (3 heartbeats of 1 s): pubsub's IHAVE no longer offers it
            joiner = Peer(tmp_path, "joiner", trainer, bootstrap=[relay_addr])
            nursery.start_soon(joiner.run)
            await joiner.ready.wait()
            while manifest.id not in joiner.node.mirror.policies:
                await joiner.node.mirror.changed.wait()
            for peer in (relay, seed, joiner):
                peer.stop()
    found = [e for e in joiner.events if e["event"] == "dht_found"]
    assert found and found[0]["version"] == manifest.version and found[0]["providers"] >= 1


async def test_swarm_publish_from_a_fresh_data_dir_numbers_its_checkpoint_past_the_runs_newest_version(tmp_path):
    """A publisher on a fresh data directory asks the swarm (the DHT's signed record) for the newest version first:
    numbered v1, its checkpoint would be dropped by every peer of a run already at v3 as older than its window."""
    from swarm.cli.publish import next_version

    trainer = Identity.generate()
    _, manifest, signed = signed_checkpoint(tmp_path, trainer, version=3)
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            seed = Peer(tmp_path, "seed", trainer, identity=trainer, heartbeat_every_s=1000.0, peer_silence_s=3000.0,
                        max_peers=0)  # no heartbeats, no data channels: nothing but the DHT carries v3
            nursery.start_soon(seed.run)
            await seed.ready.wait()
            seed.node.mirror.adopt(signed, local_dir=tmp_path / "ckpt")
            await seed.node.announce_policy(signed, manifest)
            await trio.sleep(4)  # past the gossip window
            publisher = Peer(tmp_path, "publisher", trainer, bootstrap=[seed.node.host.multiaddrs[0]])
            nursery.start_soon(publisher.run)
            await publisher.ready.wait()
            assert publisher.node.mirror.latest() is None
            assert await next_version(publisher.node, "t", trainer.public_bytes) == 4
            lonely = Peer(tmp_path, "lonely", trainer)  # no peers: what its own data directory holds, plus one
            nursery.start_soon(lonely.run)
            await lonely.ready.wait()
            assert await next_version(lonely.node, "t", trainer.public_bytes) == 1
            for peer in (seed, publisher, lonely):
                peer.stop()


async def _connect(peer: Peer, other: Peer) -> None:
    await peer.node.host.connect(other.node.host.multiaddrs[0])


async def test_a_peer_whose_bootstrap_peer_comes_up_later_or_again_connects_to_it(tmp_path):
    """The bootstrap peer is often the trainer, which restarts on its address: the peer keeps dialing it back."""
    import socket

    trainer = Identity.generate()
    with socket.socket() as probe:  # a free port for the bootstrap peer to come up on later
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    listen = f"/ip4/127.0.0.1/tcp/{port}"
    joiner = Peer(tmp_path, "joiner", trainer, bootstrap=[f"{listen}/p2p/{trainer.peer_id}"])
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(joiner.run)
            await joiner.ready.wait()
            assert any(e["event"] == "bootstrap_unreachable" for e in joiner.events)
            for life in range(2):
                boot = Peer(tmp_path, "boot", trainer, identity=trainer, listen=(listen,))
                nursery.start_soon(boot.run)
                await boot.ready.wait()
                while sum(e["event"] == "bootstrap_reconnected" for e in joiner.events) <= life:
                    await trio.sleep(0.05)
                assert trainer.peer_id in joiner.node.connected_peers()
                boot.stop()
                while trainer.peer_id in joiner.node.connected_peers():
                    await trio.sleep(0.05)
                await boot.finished.wait()  # as a restarted process starts once the old one has exited (its port free)
            joiner.stop()


async def test_forged_manifest_is_refused(tmp_path):
    trainer, forger = Identity.generate(), Identity.generate()
    make_checkpoint(tmp_path / "ckpt", floats=1000)
    manifest = build_manifest(tmp_path / "ckpt", run="t", version=1, parent_version=None, created_at=0.0,
                              generation=GenerationSettings(4, 0.6, 64, 0))
    forged = sign_manifest(manifest, forger.sign, forger.public_bytes).to_bytes()
    peer = Peer(tmp_path, "p", trainer)
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(peer.run)
            await peer.ready.wait()
            assert peer.node.mirror.adopt(forged) is None
            peer.stop()
    assert manifest.id not in peer.node.mirror.policies
    assert any(e["event"] == "refused" for e in peer.events)


def _read_event(proc, kind: str, deadline: float) -> dict:
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        event = json.loads(line)
        if event["event"] == kind:
            return event
    raise AssertionError(f"no {kind!r} event")


def test_two_swarm_processes_second_joins_through_first_multiaddr(tmp_path):
    """`swarm publish` prints its multiaddr; `swarm peer start --role seed --bootstrap` joins through it, fetches
    the policy without ever importing torch, and exits once complete.

    The publisher runs in text mode, as a person runs it: the join uses the address as printed, and its lines are
    checked (it once died right after publishing on a text line naming fields it did not have)."""
    original = make_checkpoint(tmp_path / "ckpt", floats=200_000)
    key = Identity.generate()
    write_key_file(tmp_path / "trainer.key", key)
    swarm = [sys.executable, "-m", "swarm"]
    pub = subprocess.Popen([*swarm, "publish", str(tmp_path / "ckpt"), "--run", "p", "--key",
                            str(tmp_path / "trainer.key"), "--data-dir", str(tmp_path / "pub"), "--piece-kb", "256"],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    peer = None
    try:
        deadline = time.monotonic() + 60
        printed = [pub.stdout.readline() for _ in range(2)]
        assert printed[0].split(" ", 1)[1].startswith("peer ") and "listening on" in printed[0], printed
        addr = printed[1].strip()
        # the seed-only peer runs as `swarm` does, and says at exit whether anything imported torch (it must not)
        seed_only = [sys.executable, "-c", "import atexit, sys; from swarm.cli import main; atexit.register(lambda: "
                     "open(sys.argv[1], 'w').write(str('torch' in sys.modules))); sys.exit(main(sys.argv[2:]))",
                     str(tmp_path / "torch-imported")]
        peer = subprocess.Popen([*seed_only, "peer", "start", "--role", "seed", "--run", "p", "--bootstrap", addr,
                                 "--data-dir", str(tmp_path / "peer"), "--exit-when-complete", "--json-events",
                                 "--trainer-key", key.public_bytes.hex()],
                                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        finished = _read_event(peer, "finished", deadline)
        assert peer.wait(30) == 0
        assert pub.poll() is None, "the publisher ended while a peer was fetching from it"
    finally:
        for p in (pub, peer):
            if p is not None and p.poll() is None:
                p.terminate()
                p.wait(10)
    assert finished["version"] == 1
    assert (tmp_path / "torch-imported").read_text() == "False"  # seed-only mode stays small
    # the publisher has exited: read through the buffered streams, since the readline() calls above may have
    # buffered the lines after the address already (communicate() reads the raw pipe and would skip them)
    out, err = pub.stdout.read(), pub.stderr.read()
    assert "published policy v1 (" in out and "FAILED" not in out + err and "Traceback" not in err, out + err
    from p2p.pieces.store import PieceStore

    with PieceStore(tmp_path / "peer" / "store") as store:
        (manifest,) = store.manifests()
        out = store.reassemble(manifest, tmp_path / "out")
    assert blake3.blake3((out / "model.safetensors").read_bytes()).digest() == blake3.blake3(original).digest()


async def test_a_slow_dht_put_is_quiet_until_it_becomes_a_streak(caplog, autojump_clock):
    """One latest-manifest put that times out is routine (the DHT re-puts it); a streak of them is one warning."""
    import logging

    from swarm.node.state import DHT_PUT_LIMIT_S, DHT_PUT_WARN_AFTER, Node

    class StuckDht:
        stuck = True

        async def put_latest_manifest(self, record):
            if self.stuck:
                await trio.sleep_forever()

    async with trio.open_nursery() as nursery:
        node = Node(config=None, host=None, gossip=None, mirror=None, events=None, nursery=nursery, dht=StuckDht())
        caplog.set_level(logging.DEBUG, logger="swarm.node.node")

        async def put_and_count_warnings() -> int:
            before = trio.current_time()
            await node._put_latest(record=None)
            assert trio.current_time() - before <= DHT_PUT_LIMIT_S  # bounded by the put limit
            return sum(r.levelno == logging.WARNING for r in caplog.records)

        assert [await put_and_count_warnings() for _ in range(DHT_PUT_WARN_AFTER + 1)] == [0] * (
            DHT_PUT_WARN_AFTER - 1
        ) + [1, 1]
        node.dht.stuck = False
        await node._put_latest(record=None)
        assert node.dht_put_misses == 0  # a stored record ends the streak
        node.dht.stuck = True
        assert [await put_and_count_warnings() for _ in range(DHT_PUT_WARN_AFTER)] == [1] * (DHT_PUT_WARN_AFTER - 1) + [
            2
        ]
    assert "not stored within" in caplog.text


def test_a_peer_is_forgotten_once_its_heartbeats_stop_and_remembered_while_they_come():
    from types import SimpleNamespace

    from swarm.node.node import Node

    no_version = SimpleNamespace(latest=lambda: None)
    node = Node(SimpleNamespace(peer=SimpleNamespace(peer_silence_s=30.0)), None, None, no_version, None, None)
    node.heard_from("validator-a", ("validator",), now=0.0)
    node.heard_from("worker-b", ("inference", "seed"), now=0.0)
    node.heard_from("worker-b", ("inference", "seed"), now=25.0)
    assert node.forget_silent(30.0) == {}
    assert node.forget_silent(30.5) == {"validator-a": ("validator",)}
    assert node.peer_roles == {"worker-b": ("inference", "seed")}
    # the only other peer known: the others' budget of one full-rate peer stretches its silence to 60 s
    assert node.forget_silent(84.0) == {}
    assert node.forget_silent(86.0) == {"worker-b": ("inference", "seed")} and node.peer_heard == {}


async def test_a_failing_role_or_peer_task_stops_the_peer_with_one_line(tmp_path, caplog):
    async def broken_role(node):
        async with trio.open_nursery() as nursery:  # what a role's tasks raise reaches it wrapped in a group
            nursery.start_soon(read_the_model)

    async def read_the_model():
        raise RuntimeError("the model file is unreadable")

    peer = Peer(tmp_path, "a", Identity.generate())
    with trio.fail_after(30):
        sink = EventSink(json_lines=False, stream=open("/dev/null", "w"))
        sink.listeners.append(lambda e: peer.events.append(e.record()))
        status = await open_node_parts(peer.config, peer.identity, sink, [broken_role], peer.trainer.public_bytes)
    assert status == 1  # an exit status, not an exception group
    failed = [e for e in peer.events if e["event"] == "role_failed"]
    assert [e["role"] for e in failed] == ["broken_role"]
    assert failed[0]["message"].startswith("RuntimeError: the model file is unreadable (at tests/test_swarm_nodes.py:")
