"""Hostile peers against real libp2p hosts and real data channels on loopback: a leech is cut off within a few
copies of the version, and stalled preambles of many fresh identities hold at most a preamble's cap each while an
honest peer is still served, and a preamble declaring more bans its sender."""

from __future__ import annotations

import random

import pytest
import trio

from p2p.channel.service import ChannelConfig, DataChannelServer, open_data_channel
from p2p.errors import ChannelError, FrameError
from p2p.host.p2p_host import open_host
from p2p.identity import Identity
from p2p.pieces.store import PieceStore
from p2p.pieces.transfer import SwarmService, TransferConfig
from p2p.pieces.wire import (
    FrameDecoder,
    Hello,
    Piece,
    Request,
    message_frame,
    pack_bits,
    parse_message,
    read_frame,
    send_buffers,
)
from swarm.policy.link_preamble import PREAMBLE_INLINE_MAX, read_body, read_head, send_preamble
from swarm.policy.mirror import PolicyMirror
from swarm.policy.trust import TrainerTrust
from tests.p2p.test_p2p_transfer import MB, make_policy
from tests.swarm.test_swarm_mirror import signed_version

LINK_ENDED = (ChannelError, FrameError, trio.BrokenResourceError, trio.ClosedResourceError)


async def leech_one_link(host, seed_id, manifest, indices) -> int:
    """Open a link, request `indices` (repeats included) one by one, return the piece bytes received before the
    link ended or the list was done."""
    stream = await open_data_channel(host, seed_id)
    decoder, got = FrameDecoder(max_payload=4 * MB), 0
    try:
        await send_buffers(stream, message_frame(Hello(manifest.id, pack_bits(bytes(manifest.num_pieces)))))
        for index in indices:
            await send_buffers(stream, message_frame(Request(index)))
            while True:
                frame = await read_frame(stream, decoder)
                if frame is None:
                    return got
                msg = parse_message(*frame, num_pieces=manifest.num_pieces)
                if isinstance(msg, Piece):
                    got += len(msg.data)
                    break
    except LINK_ENDED:
        pass
    finally:
        await trio.aclose_forcefully(stream)
    return got


@pytest.mark.parametrize("pattern", ["same-pieces-one-link", "each-piece-once-per-link"])
async def test_a_leech_is_cut_off_within_a_few_copies_of_the_version(tmp_path, pattern):
    manifest = make_policy(tmp_path / "src", 4 * MB)  # 16 pieces of 256 KiB
    with PieceStore(tmp_path / "seed") as store:
        store.add_local_policy(manifest, tmp_path / "src")
        service = SwarmService(manifest, store, config=TransferConfig(), rng=random.Random(0))
        async with open_host() as seed_host, open_host() as leech_host, trio.open_nursery() as nursery:
            await nursery.start(service.run)
            await seed_host.nursery.start(DataChannelServer(seed_host, service.serve_link).run)
            await leech_host.connect(seed_host.multiaddrs[0])
            pulled = 0
            with trio.fail_after(120):
                if pattern == "same-pieces-one-link":  # the attack: 13 pieces asked for again and again
                    pulled = await leech_one_link(leech_host, seed_host.peer_id, manifest, list(range(13)) * 50)
                else:  # every piece once per link, then a new link: no re-request on any one link
                    for _ in range(30):
                        if leech_host.peer_id in service.banned:
                            break
                        pulled += await leech_one_link(leech_host, seed_host.peer_id, manifest,
                                                       range(manifest.num_pieces))
                        while leech_host.peer_id in service.peers:  # the seed saw the link end
                            await trio.sleep(0.01)
            nursery.cancel_scope.cancel()
    assert leech_host.peer_id in service.banned
    limit = TransferConfig().engine.upload_factor * manifest.total_size
    if pattern == "same-pieces-one-link":
        assert "asked again for piece 0" in service.drops[leech_host.peer_id]
        assert pulled <= manifest.total_size  # 13 pieces, once
    else:
        assert "without serving enough back" in service.drops[leech_host.peer_id]
        assert limit - manifest.total_size < pulled <= limit  # it got its three copies, then nothing more


async def stall_preambles(host, target_id, declared: int, sent: int, channels: int, stop: trio.Event) -> None:
    """Open `channels` data channels, each declaring a manifest of `declared` bytes and sending `sent` of them,
    then hold them open until `stop`."""
    opened = []
    for _ in range(channels):
        stream = await open_data_channel(host, target_id)
        opened.append(stream)
        try:
            await stream.send_all(bytes(32) + declared.to_bytes(4, "big") + bytes(sent))
        except LINK_ENDED:  # the target dropped this channel: its budget was spent
            pass
    await stop.wait()
    for stream in opened:
        await trio.aclose_forcefully(stream)


async def test_stalled_preambles_of_fresh_identities_hold_a_preamble_each_and_honest_peers_are_served(tmp_path):
    """Six fresh identities with four channels each declare the largest preamble and stall 1 KiB short of its end:
    each channel holds at most 64 KiB, all 24 wait, and an honest peer's link to the version is served meanwhile.
    A seventh identity declaring a 32 MiB manifest is banned at the head."""
    key = Identity.generate()
    signed = signed_version(tmp_path, key, 0)
    with PieceStore(tmp_path / "target") as store:
        async with open_host() as target, open_host() as honest, trio.open_nursery() as nursery:
            mirror = PolicyMirror(store, target.peer_id, TrainerTrust("r", key.public_bytes, tmp_path / "t"), run="r",
                                  copies_dir=tmp_path / "policies")
            await nursery.start(mirror.run_service)
            policy = mirror.adopt(signed, local_dir=tmp_path / "v0")  # the target seeds version 0
            await target.nursery.start(DataChannelServer(target, mirror.accept_link, ChannelConfig()).run)
            stop = trio.Event()
            attackers = []
            async with trio.open_nursery() as attack:
                for _ in range(7):
                    host = await attack.start(_hold_host)
                    await host.connect(target.multiaddrs[0])
                    attackers.append(host)
                with trio.fail_after(60):
                    async with trio.open_nursery() as senders:
                        for host in attackers[:6]:
                            senders.start_soon(stall_preambles, host, target.peer_id, PREAMBLE_INLINE_MAX,
                                               PREAMBLE_INLINE_MAX - 1024, 4, stop)
                        senders.start_soon(stall_preambles, attackers[6], target.peer_id, 32 * MB, 1024, 1, stop)
                        while sum(mirror.inbound._waiting.values()) < 24 or attackers[6].peer_id not in mirror.banned:
                            await trio.sleep(0.05)
                        assert "preamble" in mirror.banned[attackers[6].peer_id]
                        await honest.connect(target.multiaddrs[0])
                        got = await _honest_download(honest, target.peer_id, policy)
                        assert got == policy.manifest.total_size
                        assert honest.peer_id not in mirror.banned
                        stop.set()
                attack.cancel_scope.cancel()
            nursery.cancel_scope.cancel()


async def _hold_host(task_status=trio.TASK_STATUS_IGNORED):
    async with open_host() as host:
        task_status.started(host)
        await trio.sleep_forever()


async def _honest_download(host, target_id, policy) -> int:
    """Link to the target for the version it seeds (a preamble naming a manifest it holds) and fetch every piece."""
    stream = await open_data_channel(host, target_id)
    await send_preamble(stream, policy.manifest.id, policy.signed)
    if host.peer_id > target_id:  # to the target ours is an announcement: it dials the link by writing its own back
        head = await read_head(stream, 10.0)
        assert await read_body(stream, head, 10.0, known=lambda route: True) is not None
    manifest = policy.manifest
    decoder, got = FrameDecoder(max_payload=4 * MB), 0
    await send_buffers(stream, message_frame(Hello(manifest.id, pack_bits(bytes(manifest.num_pieces)))))
    for index in range(manifest.num_pieces):
        await send_buffers(stream, message_frame(Request(index)))
    while got < manifest.total_size:
        frame = await read_frame(stream, decoder)
        assert frame is not None, "the target closed an honest link"
        msg = parse_message(*frame, num_pieces=manifest.num_pieces)
        if isinstance(msg, Piece):
            got += len(msg.data)
    await trio.aclose_forcefully(stream)
    return got
