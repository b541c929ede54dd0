"""Real libp2p hosts on loopback for the link-squatting tests: honest mirrors that link and reconcile as a node does,
a publisher holding the trainer key, and squatters: identities that open a link to every peer for each version,
answer every link and announcement offered to them, claim to hold no piece and never send or ask for one."""

from __future__ import annotations

import subprocess
import sys
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import trio
from safetensors.numpy import save_file

from p2p.channel.service import ChannelConfig, DataChannelServer, open_data_channel
from p2p.errors import ChannelError, FrameError, P2PError
from p2p.host.p2p_host import HostConfig, open_host
from p2p.identity import Identity
from p2p.pieces.manifest import GenerationSettings, build_manifest, decode_signed, sign_manifest, verify_manifest
from p2p.pieces.store import PieceStore
from p2p.pieces.wire import Hello, message_frame, pack_bits, send_buffers
from swarm.policy.link_preamble import read_body, read_head, send_preamble
from swarm.policy.mirror import PolicyMirror
from swarm.policy.trust import TrainerTrust

ENDED = (ChannelError, FrameError, P2PError, OSError, trio.BrokenResourceError, trio.ClosedResourceError,
         trio.TooSlowError)
MAX_PEERS = 64
REPO = Path(__file__).resolve().parents[2]


def signed_policy(tmp, key: Identity, version: int, size: int = 2 << 20) -> tuple[bytes, object]:
    """A version of `size` random bytes in 256 KiB pieces, signed by `key`: (signed manifest, its directory)."""
    directory = tmp / f"v{version}"
    directory.mkdir(parents=True)
    weights = np.random.default_rng(version).standard_normal(size // 4, dtype=np.float32)
    save_file({"w": weights}, str(directory / "model.safetensors"))
    (directory / "model.json").write_text('{"architecture": "test"}')
    manifest = build_manifest(directory, run="r", version=version, parent_version=version - 1 if version else None,
                              created_at=0.0, generation=GenerationSettings(2, 1.0, 8, 0), piece_size=262144)
    return sign_manifest(manifest, key.sign, key.public_bytes).to_bytes(), directory


@dataclass
class Honest:
    """One honest peer: its host and its policy mirror."""

    host: object
    mirror: PolicyMirror


async def _reconcile_rounds(peer: Honest) -> None:
    """What a node's link task does (swarm.node.node._reconcile_links)."""
    async def dial(peer_id: str):
        return await open_data_channel(peer.host, peer_id)

    while True:
        changed = peer.mirror.changed
        await peer.mirror.reconcile(peer.host.connected_peers(), dial, MAX_PEERS)
        with trio.move_on_after(peer.mirror.reconcile_pause()):
            await changed.wait()


@asynccontextmanager
async def honest_peer(tmp, trainer: Identity, identity: Identity | None = None, **settings):
    """A started honest peer (the publisher when `identity` is the trainer's key)."""
    async with AsyncExitStack() as stack:
        host = await stack.enter_async_context(open_host(HostConfig(identity=identity)))
        store = stack.enter_context(PieceStore(tmp / "store"))
        mirror = PolicyMirror(store, host.peer_id, TrainerTrust("r", trainer.public_bytes, tmp), run="r",
                              **settings)
        nursery = await stack.enter_async_context(trio.open_nursery())
        await nursery.start(mirror.run_service)
        await nursery.start(DataChannelServer(host, mirror.accept_link, ChannelConfig()).run)
        peer = Honest(host, mirror)
        nursery.start_soon(_reconcile_rounds, peer)
        yield peer
        nursery.cancel_scope.cancel()


@dataclass
class Squatter:
    """One identity of the crowd; `links` counts the links it got a hello back on."""

    host: object
    pieces: dict[bytes, int]  # manifest id -> piece count, for every version out (the crowd reads gossip too)
    targets: list[str] = field(default_factory=list)
    links: int = 0

    def squat(self, manifest_id: bytes, signed: bytes, nursery: trio.Nursery) -> None:
        """Open a link for the version to every target, at once."""
        for target in self.targets:
            nursery.start_soon(self._link, target, manifest_id, signed)

    async def _link(self, target: str, manifest_id: bytes, signed: bytes) -> None:
        try:
            stream = await open_data_channel(self.host, target)
            await send_preamble(stream, manifest_id, signed)
            if self.host.peer_id > target:  # an announcement: the target links by writing its preamble back
                head = await read_head(stream, 30.0)
                if head is None or await read_body(stream, head, 30.0, known=lambda route: True) is None:
                    return
            await self._hold(stream, manifest_id)
        except ENDED:
            return

    async def accept(self, peer: str, stream) -> None:
        """A channel an honest peer opened to us: a spare waiting for a preamble, a link, or an announcement; a
        squatter takes whatever link is offered."""
        try:
            head = await read_head(stream, 600.0)
            if head is None or await read_body(stream, head, 30.0, known=lambda route: True) is None:
                return
            if peer > self.host.peer_id:  # it announced a version to us: we take the link it offers
                await send_preamble(stream, head.route, b"")
            await self._hold(stream, head.route)
        except ENDED:
            return

    async def _hold(self, stream, manifest_id: bytes) -> None:
        """Claim no piece and read everything sent, forever."""
        if manifest_id not in self.pieces:
            return
        empty = pack_bits(bytes(self.pieces[manifest_id]))
        await send_buffers(stream, message_frame(Hello(manifest_id, empty)))
        self.links += 1
        while await stream.receive_some(1 << 16):
            pass


@asynccontextmanager
async def squatter_crowd(count: int):
    """`count` squatters, each its own identity and host, serving the data channels honest peers open to them."""
    async with AsyncExitStack() as stack:
        nursery = await stack.enter_async_context(trio.open_nursery())
        crowd, pieces = [], {}
        for _ in range(count):
            host = await stack.enter_async_context(open_host())
            squatter = Squatter(host, pieces)
            await nursery.start(DataChannelServer(host, squatter.accept, ChannelConfig()).run)
            crowd.append(squatter)
        yield crowd
        nursery.cancel_scope.cancel()


class CrowdProcess:
    """A crowd of squatters in a process of its own, as an attacker's would be: its CPU is not the honest peers'.
    Driven by lines on its stdin (`connect MULTIADDR`, `squat SIGNED_HEX`), each answered `ok` when done."""

    def __init__(self, process: trio.Process) -> None:
        self._process = process
        self._buffer = b""

    async def command(self, line: str) -> None:
        await self._process.stdin.send_all(line.encode() + b"\n")
        while b"\n" not in self._buffer:
            chunk = await self._process.stdout.receive_some(1 << 16)
            if not chunk:
                raise RuntimeError("the squatter crowd's process ended")
            self._buffer += chunk
        answer, self._buffer = self._buffer.split(b"\n", 1)
        assert answer == b"ok", answer


@asynccontextmanager
async def crowd_process(count: int):
    """Start `count` squatters in a child process; yield its driver."""
    process = await trio.lowlevel.open_process([sys.executable, "-m", "tests.swarm.link_squatters", str(count)],
                                               stdin=subprocess.PIPE, stdout=subprocess.PIPE, cwd=REPO)
    try:
        crowd = CrowdProcess(process)
        await crowd.command("ready")
        yield crowd
    finally:
        process.kill()
        await process.wait()


async def _serve_commands(count: int) -> None:
    stdin = trio.lowlevel.FdStream(0)
    stdout = trio.lowlevel.FdStream(1)
    async with squatter_crowd(count) as crowd, trio.open_nursery() as nursery:
        buffer = b""
        while True:
            while b"\n" not in buffer:
                chunk = await stdin.receive_some(1 << 20)
                if not chunk:
                    nursery.cancel_scope.cancel()
                    return
                buffer += chunk
            line, buffer = buffer.split(b"\n", 1)
            verb, _, arg = line.decode().partition(" ")
            if verb == "connect":  # every squatter that the peer's admission of new peers lets in
                for squatter in crowd:
                    try:
                        squatter.targets.append(await squatter.host.connect(arg))
                    except P2PError:
                        pass
            elif verb == "squat":
                signed = bytes.fromhex(arg)
                manifest = verify_manifest(signed, decode_signed(signed).public_key)
                for squatter in crowd:
                    squatter.pieces[manifest.id] = manifest.num_pieces
                    squatter.squat(manifest.id, signed, nursery)
            await stdout.send_all(b"ok\n")


if __name__ == "__main__":
    trio.run(_serve_commands, int(sys.argv[1]))
