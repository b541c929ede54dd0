"""What a preamble carries of its version's manifest: a small one whole, a large one by id alone, and nothing when it
answers an announcement (the announcer holds the manifest it named)."""

from __future__ import annotations

import trio
import trio.testing

from p2p.identity import Identity
from p2p.pieces.store import PieceStore
from swarm.event_types import Link
from swarm.policy import link_preamble
from swarm.policy.link_preamble import HEAD_BYTES, decode_head, inline_manifest
from swarm.policy.mirror import PolicyMirror
from swarm.policy.trust import TrainerTrust
from tests.swarm.test_swarm_mirror import signed_version


def test_only_a_small_manifest_travels_inline():
    assert inline_manifest(b"m" * 1000) == b"m" * 1000
    assert inline_manifest(b"m" * (link_preamble.PREAMBLE_INLINE_MAX + 1)) == b""


async def _dial_and_read_head(mirror: PolicyMirror, peer: str) -> tuple[bytes, trio.testing.MemoryReceiveStream]:
    """Let `mirror` open its link to `peer` over a spare channel (a memory stream); the preamble's head, and the
    far end of the stream."""
    ours, theirs = trio.testing.memory_stream_pair()
    mirror.spares._spares[peer] = (ours, trio.current_time() + mirror.spares.ttl)

    async def dial(_peer):
        await trio.sleep_forever()  # the spare that replaces the one used: never needed here

    await mirror.reconcile([peer], dial, max_links=8)
    return await read_head_bytes(theirs), theirs


async def read_head_bytes(stream) -> bytes:
    """The preamble's 36-byte head as it arrives on `stream`."""
    head = b""
    with trio.fail_after(10):
        while len(head) < HEAD_BYTES:
            head += await stream.receive_some(HEAD_BYTES - len(head))
    return head


async def test_a_large_manifest_is_named_by_id_and_the_acceptor_links_once_it_adopts_it(tmp_path, autojump_clock,
                                                                                         monkeypatch):
    key = Identity.generate()
    signed = signed_version(tmp_path, key, 0)
    with PieceStore(tmp_path / "a", keep_versions=2) as a_store, PieceStore(tmp_path / "b", keep_versions=2) as b_store:
        trust = TrainerTrust("r", key.public_bytes, tmp_path)
        dialer = PolicyMirror(a_store, "peer-a", trust, run="r", keep=2)
        acceptor = PolicyMirror(b_store, "peer-b", trust, run="r", keep=2)
        async with trio.open_nursery() as nursery:
            await nursery.start(dialer.run_service)
            await nursery.start(acceptor.run_service)
            policy = dialer.adopt(signed, local_dir=tmp_path / "v0")
            await trio.sleep(0.1)  # its service starts
            for peer, limit, carried in (("peer-b", len(signed), len(signed)), ("peer-c", len(signed) - 1, 0)):
                monkeypatch.setattr(link_preamble, "PREAMBLE_INLINE_MAX", limit)
                head, far = await _dial_and_read_head(dialer, peer)
                assert decode_head(head).signed_size == carried
                assert decode_head(head).route == policy.manifest.id
                if carried:
                    await far.aclose()
                    continue
                # named by id only: the acceptor waits until it adopts the version another way (gossip), then links
                linked = trio.Event()
                acceptor.on_event = lambda event: linked.set() if isinstance(event, Link) else None
                ours, theirs = trio.testing.memory_stream_pair()
                await ours.send_all(head)
                nursery.start_soon(acceptor.accept_link, "peer-a", theirs)  # peer-c's side, as seen from peer-c
                await trio.sleep(5)
                assert not linked.is_set() and policy.manifest.id not in acceptor.policies
                acceptor.adopt(signed)  # what gossip's announcement and fetch do
                with trio.fail_after(5):
                    await linked.wait()
            nursery.cancel_scope.cancel()


async def test_the_answer_to_an_announcement_carries_no_manifest(tmp_path, autojump_clock):
    key = Identity.generate()
    signed = signed_version(tmp_path, key, 0)
    with PieceStore(tmp_path / "a", keep_versions=2) as store:
        trust = TrainerTrust("r", key.public_bytes, tmp_path)
        smaller = PolicyMirror(store, "peer-a", trust, run="r", keep=2)
        async with trio.open_nursery() as nursery:
            await nursery.start(smaller.run_service)
            policy = smaller.adopt(signed)
            ours, theirs = trio.testing.memory_stream_pair()
            await theirs.send_all(policy.manifest.id + len(signed).to_bytes(4, "big") + signed)  # the announcement
            nursery.start_soon(smaller.accept_link, "peer-b", ours)
            head = await read_head_bytes(theirs)
            assert decode_head(head).route == policy.manifest.id and decode_head(head).signed_size == 0
            nursery.cancel_scope.cancel()


async def test_an_announcement_of_a_large_manifest_names_it_by_id(tmp_path, autojump_clock, monkeypatch):
    """The larger peer announcing a version over its spare sends the manifest only when it is small."""
    key = Identity.generate()
    signed = signed_version(tmp_path, key, 0)
    monkeypatch.setattr(link_preamble, "PREAMBLE_INLINE_MAX", len(signed) - 1)
    with PieceStore(tmp_path / "b", keep_versions=2) as store:
        larger = PolicyMirror(store, "peer-b", TrainerTrust("r", key.public_bytes, tmp_path), run="r", keep=2)
        async with trio.open_nursery() as nursery:
            await nursery.start(larger.run_service)
            policy = larger.adopt(signed, local_dir=tmp_path / "v0")
            ours, theirs = trio.testing.memory_stream_pair()
            larger.spares._spares["peer-a"] = (ours, trio.current_time() + larger.spares.ttl)

            async def dial(_peer):
                await trio.sleep_forever()

            await trio.sleep(1.5)  # the smaller peer has not dialed its link: the larger one announces the version
            await larger.reconcile(["peer-a"], dial, max_links=8)
            assert "peer-a" in policy.announced
            head = await read_head_bytes(theirs)
            assert decode_head(head).route == policy.manifest.id and decode_head(head).signed_size == 0
            nursery.cancel_scope.cancel()
