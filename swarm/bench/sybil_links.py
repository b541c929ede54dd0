"""`swarm bench sybil`'s link-squatting attack: a crowd of fresh identities opens a data link to every peer for each
new policy version, claims to hold no piece, and never requests or serves one.

Two runs of a publisher and three honest peers (`swarm bench broadcast`'s processes, fully connected and warmed up
as there): one without the crowd, one with N identities connected to every peer before the version is announced;
each identity opens a data channel to every peer ahead of the version, as an honest mirror keeps spares, learns the
version from gossip (one spy stands in for all of them) and makes each channel a link that holds nothing.
Reported: the honest peers' completion time (announcement to the last honest peer holding every piece) with and
without the crowd, the publisher's CPU and memory over the run with the crowd (it holds the only copy at first, so a
squatter there costs every honest peer), and the spares and links the crowd got open.
"""

from __future__ import annotations

import argparse
import subprocess
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import trio

from p2p.channel.service import DataChannel, open_data_channel
from p2p.gossip.service import open_gossip
from p2p.host.p2p_host import P2PHost, open_host
from p2p.identity import Identity, write_key_file
from p2p.pieces.manifest import open_signed_manifest
from p2p.pieces.wire import FrameDecoder, Hello, message_frame, pack_bits, read_frame, send_buffers
from swarm.bench.broadcast import _PUBLISHER, EventProcess, PeerArgs, _make_checkpoint, _peer_argvs, _warm_up
from swarm.bench.local_ports import free_ports
from swarm.bench.sybil_measure import Meter, attacker_config, fresh_identities, sample_until_cancelled
from swarm.messages.gossip_bodies import DECODERS, decode_manifest_announcement
from swarm.policy.link_preamble import inline_manifest, send_preamble

HONEST_PEERS = 3
PIECE_KB = 256
START_TIMEOUT_S = 60.0
WARMUP_S = 20.0
LINK_TIMEOUT_S = 10.0
CROWD_CONNECT_S = 60.0
"""Longest the crowd has to connect to every peer before the version is announced."""


async def open_spares(host: P2PHost, addrs: list[str]) -> list:
    """A data channel to each peer, opened ahead of any version as an honest mirror keeps its spares (a link then
    starts at once); a peer that refuses or is too slow gets none."""
    spares: list = []

    async def one(peer_id: str) -> None:
        with trio.move_on_after(LINK_TIMEOUT_S):
            spares.append(await open_data_channel(host, peer_id))

    async with trio.open_nursery() as nursery:
        for addr in addrs:
            nursery.start_soon(_quietly, one, addr.rsplit("/p2p/", 1)[1])
    return spares


async def squat(stream: DataChannel, found: dict, opened: list[int]) -> None:
    """Make a spare the version's link: the preamble, a Hello holding nothing, then silence; what the peer sends
    is read and dropped until it hangs up."""
    with trio.move_on_after(LINK_TIMEOUT_S) as sending:
        await send_preamble(stream, found["id"], inline_manifest(found["signed"]))
        await send_buffers(stream, message_frame(Hello(found["id"], pack_bits(bytes(found["pieces"])))))
    if sending.cancelled_caught:
        return
    opened[0] += 1
    decoder = FrameDecoder(max_payload=4 << 20)
    while await read_frame(stream, decoder) is not None:
        pass


async def crowd_member(identity: Identity, addrs: list[str], version: trio.Event, found: dict, counts: dict) -> None:
    """Connect to every peer and open a spare to each (counted in `counts`), wait for the version, make every
    spare a link that holds nothing, and hold them."""
    async with open_host(attacker_config(identity)) as host, trio.open_nursery() as nursery:
        async with trio.open_nursery() as dials:
            for addr in addrs:
                dials.start_soon(_quietly, host.connect, addr)
        spares = await open_spares(host, addrs)
        counts["ready"] += 1
        counts["spares"] += len(spares)
        await version.wait()
        for stream in spares:
            nursery.start_soon(_quietly, squat, stream, found, counts["links"])


async def _quietly(fn: Callable[..., Awaitable[object]], *args: object) -> None:
    try:
        await fn(*args)
    except Exception:  # noqa: BLE001 - a peer refused this squatter's dial or link: it tries the others
        pass


async def spy(run: str, addr: str, found: dict, version: trio.Event,
              task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
    """Hear the version's announcement for the whole crowd and set `version` with its manifest in `found`."""
    async with open_host(attacker_config(Identity.generate())) as host, \
            open_gossip(host, run, kinds=("manifest",), decoders=DECODERS) as gossip:
        await host.connect(addr)
        task_status.started()
        async for env in gossip.subscribe("manifest"):
            announced = decode_manifest_announcement(env)
            if announced.signed is not None:
                manifest = open_signed_manifest(announced.signed).manifest
                found.update(id=announced.manifest_id, signed=announced.signed, pieces=manifest.num_pieces)
                version.set()
                return


def _start(work: Path, tag: str, key: Identity, args: argparse.Namespace, procs: list[EventProcess]) -> None:
    """The publisher (waiting for a line on stdin) and the honest peers, all started at once, into `procs` as each
    starts (the caller stops every one that did)."""
    seed_port, *ports = free_ports(HONEST_PEERS + 1)
    seed_listen = f"/ip4/127.0.0.1/tcp/{seed_port}"
    pub = EventProcess(["-c", _PUBLISHER, str(work / "ckpt"), f"bench-{tag}", str(work / "trainer.key"),
                        str(work / f"{tag}-seed"), str(PIECE_KB), str(args.squat_mbps), seed_listen],
                       work / f"{tag}-seed.log", stdin=subprocess.PIPE)
    procs.append(pub)
    for i, argv in enumerate(_peer_argvs(work, PeerArgs(args.squat_mbps), tag, key.public_bytes.hex(),
                                         f"{seed_listen}/p2p/{key.peer_id}", True, ports)):
        procs.append(EventProcess(argv, work / f"{tag}-peer{i}.log"))


def _completion(procs: list[EventProcess], timeout: float) -> float | None:
    """Announcement to the last honest peer's `complete`; None when one did not complete in time."""
    deadline = time.monotonic() + timeout
    published = procs[0].wait_for("published", deadline)
    try:
        done = [p.wait_for("complete", deadline, id=published["id"]) for p in procs[1:]]
    except Exception:  # noqa: BLE001 - UserError: a peer exited or ran out of time
        return None
    return round(max(d["t"] for d in done) - published["t"], 2)


async def squat_phase(work: Path, tag: str, key: Identity, identities: list[Identity],
                      args: argparse.Namespace) -> dict:
    """One run: start, warm up, connect the crowd, announce, time the honest peers' completion."""
    procs: list[EventProcess] = []
    try:
        _start(work, tag, key, args, procs)
        listening = [await trio.to_thread.run_sync(p.wait_for, "listening", time.monotonic() + START_TIMEOUT_S)
                     for p in procs]
        addrs = [event["addrs"][0] for event in listening]
        await trio.to_thread.run_sync(_warm_up, procs, time.monotonic() + WARMUP_S)
        meter, found, version = Meter(procs[0].popen.pid), {}, trio.Event()
        counts = {"ready": 0, "spares": 0, "links": [0]}
        async with trio.open_nursery() as nursery:
            await nursery.start(spy, f"bench-{tag}", addrs[0], found, version)
            for identity in identities:
                nursery.start_soon(crowd_member, identity, addrs, version, found, counts)
            with trio.move_on_after(CROWD_CONNECT_S):
                while counts["ready"] < len(identities):
                    await trio.sleep(0.2)
            meter.start()
            nursery.start_soon(sample_until_cancelled, meter)
            procs[0].popen.stdin.write("go\n")
            procs[0].popen.stdin.flush()
            took = await trio.to_thread.run_sync(_completion, procs, args.seconds * 3)
            meter.stop()
            nursery.cancel_scope.cancel()
        died = any(p.popen.poll() is not None for p in procs)
    finally:
        for p in procs:
            p.stop()
    return {"completion_s": took, "crowd_ready": counts["ready"], "spares_opened": counts["spares"],
            "links_opened": counts["links"][0], "meter": meter, "died": died}


def run_link_squatting(work: Path, run: str, n: int, args: argparse.Namespace) -> dict:
    """Without the crowd, then with it; the publisher measured over the run with it."""
    _make_checkpoint(work / "ckpt", args.squat_mb)
    key = Identity.generate()
    write_key_file(work / "trainer.key", key)
    without = trio.run(squat_phase, work, "squat-alone", key, [], args)
    crowd = trio.run(squat_phase, work, "squat-crowd", key, fresh_identities(n), args)
    return {**crowd["meter"].result(), "target": "publisher", "size_mb": args.squat_mb,
            "honest_completion_s": {"with": crowd["completion_s"], "without": without["completion_s"]},
            "crowd_ready": crowd["crowd_ready"], "spares_opened": crowd["spares_opened"],
            "links_opened": crowd["links_opened"],
            "peer_died": crowd["died"] or without["died"]}
