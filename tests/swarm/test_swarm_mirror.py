"""The policy mirror's window: a version pushed out of it while a link to it was being dialed takes no new link."""

from __future__ import annotations

import json

import numpy as np
import pytest
import trio
import trio.testing
from safetensors.numpy import save_file

from p2p.identity import Identity
from p2p.pieces.manifest import GenerationSettings, build_manifest, sign_manifest
from p2p.pieces.store import PieceStore
from swarm.event_types import PeerDropped
from swarm.policy.mirror import PolicyMirror
from swarm.policy.trust import TrainerTrust


def signed_version(tmp, key: Identity, version: int) -> bytes:
    directory = tmp / f"v{version}"
    directory.mkdir()
    save_file({"w": np.full(1024, version, dtype=np.float32)}, str(directory / "model.safetensors"))
    (directory / "model.json").write_text(json.dumps({"architecture": "test"}))
    manifest = build_manifest(directory, run="r", version=version, parent_version=version - 1 if version else None,
                              created_at=0.0, generation=GenerationSettings(2, 1.0, 8, 0), piece_size=262144)
    return sign_manifest(manifest, key.sign, key.public_bytes).to_bytes()


async def test_a_link_dialed_for_a_dropped_version_is_closed_not_handed_to_its_service(tmp_path, autojump_clock):
    key = Identity.generate()
    with PieceStore(tmp_path / "store", keep_versions=2) as store:
        mirror = PolicyMirror(store, "me", TrainerTrust("r", key.public_bytes, tmp_path), run="r", keep=2,
                              copies_dir=tmp_path / "peer" / "policies")
        async with trio.open_nursery() as nursery:
            await nursery.start(mirror.run_service)
            oldest = mirror.adopt(signed_version(tmp_path, key, 0))
            ours, theirs = trio.testing.memory_stream_pair()
            dialed = trio.Event()

            async def dial(peer):
                dialed.set()
                await trio.sleep(1.0)  # virtual time; meanwhile two newer versions push v0 out of the window
                return ours

            nursery.start_soon(mirror.outbound._dial_link, oldest, "peer", dial)
            await dialed.wait()
            for version in (1, 2):
                mirror.adopt(signed_version(tmp_path, key, version))
            assert oldest.manifest.id not in mirror.policies
            await trio.sleep(2.0)  # virtual time; a dial outliving its nursery raises "Nursery is closed" here
            assert "peer" not in oldest.service.peers
            assert await theirs.receive_some(1 << 16)  # the preamble went out, then our end was closed
            nursery.cancel_scope.cancel()


async def test_an_expired_spare_is_closed_cleanly_and_a_vanished_dialer_is_no_error(tmp_path, autojump_clock):
    """An expired spare is closed (a clean end, so its acceptor sees no truncated channel and logs no warning), and
    an acceptor whose dialer vanishes before the preamble just stops."""
    from p2p.errors import ChannelError

    key = Identity.generate()
    with PieceStore(tmp_path / "store", keep_versions=2) as store:
        mirror = PolicyMirror(store, "me", TrainerTrust("r", key.public_bytes, tmp_path), run="r", keep=2,
                              spare_ttl=10.0)
        async with trio.open_nursery() as nursery:
            await nursery.start(mirror.run_service)
            ours, theirs = trio.testing.memory_stream_pair()
            mirror.spares._spares["peer"] = (ours, trio.current_time() + 10.0)
            await trio.sleep(11.0)  # virtual time: past the spare's lifetime
            assert mirror.spares.take("peer", trio.current_time()) is None
            with trio.fail_after(1):
                assert await theirs.receive_some(1024) == b""  # closed, not left to the garbage collector

            class Truncated:
                async def receive_some(self, max_bytes=None):
                    raise ChannelError("data channel from peer ended without its final record (truncated)")

            with trio.fail_after(1):
                assert await mirror.accept_link("peer", Truncated()) is None  # quietly, no exception
            assert mirror.inbound._waiting.get("peer", 0) == 0
            nursery.cancel_scope.cancel()


async def test_a_version_being_reassembled_is_held_out_of_garbage_collection(tmp_path, autojump_clock):
    """A slow peer reassembled a version in a worker thread while newer versions pushed it out of the window, and
    the store closed and deleted its files under the reading thread. Held, it stays (files included) until read."""

    from swarm.policy.files import PolicyLeftWindow, materialize

    key = Identity.generate()
    with PieceStore(tmp_path / "store", keep_versions=2) as store:
        mirror = PolicyMirror(store, "me", TrainerTrust("r", key.public_bytes, tmp_path), run="r", keep=2,
                              copies_dir=tmp_path / "peer" / "policies")
        async with trio.open_nursery() as nursery:
            await nursery.start(mirror.run_service)
            oldest = mirror.adopt(signed_version(tmp_path, key, 0), local_dir=tmp_path / "v0")
            with mirror.holding(oldest):
                for version in (1, 2, 3):
                    mirror.adopt(signed_version(tmp_path, key, version), local_dir=tmp_path / f"v{version}")
                assert mirror.is_mirrored(oldest) and oldest.manifest.id in {m.id for m in store.manifests()}
                out = store.reassemble(oldest.manifest, tmp_path / "read-v0")  # what the worker thread does
            assert (out / "model.safetensors").read_bytes() == (tmp_path / "v0" / "model.safetensors").read_bytes()
            mirror.adopt(signed_version(tmp_path, key, 4), local_dir=tmp_path / "v4")  # the next collection drops it
            assert not mirror.is_mirrored(oldest)
            with pytest.raises(PolicyLeftWindow, match="left the window"):
                await materialize(mirror, oldest)
            nursery.cancel_scope.cancel()


async def test_reassembled_copies_go_with_their_versions_but_not_while_held(tmp_path, autojump_clock):
    """Every version an inference peer or validator uses is a full copy of the model on disk, so a long run would
    fill the disk: the copies follow the window, a copy being loaded stays, and leftovers of an earlier process go
    at start."""
    from types import SimpleNamespace

    from swarm.policy.files import open_version

    key = Identity.generate()
    copies = tmp_path / "peer" / "policies"
    (copies / "v9-0123456789ab").mkdir(parents=True)  # left by an earlier process, of a version no longer held
    (copies / "v9-0123456789ab" / "model.safetensors").write_bytes(b"old")
    spec = SimpleNamespace()
    with PieceStore(tmp_path / "store", keep_versions=2) as store:
        mirror = PolicyMirror(store, "me", TrainerTrust("r", key.public_bytes, tmp_path), run="r", keep=2,
                              copies_dir=copies)
        async with trio.open_nursery() as nursery:
            await nursery.start(mirror.run_service)
            assert list(copies.iterdir()) == []
            versions = [mirror.adopt(signed_version(tmp_path, key, v), local_dir=tmp_path / f"v{v}") for v in (0, 1)]
            with pytest.MonkeyPatch.context() as patch:
                patch.setattr("swarm.policy.files.version_tasks", lambda spec, manifest, directory: "tasks")
                async with open_version(mirror, spec, versions[0]) as (directory, tasks):
                    assert (directory / "model.safetensors").is_file() and tasks == "tasks"
                    mirror.adopt(signed_version(tmp_path, key, 2), local_dir=tmp_path / "v2")
                    assert (directory / "model.safetensors").is_file()  # v0 is out of the window but being loaded
                async with open_version(mirror, spec, versions[1]) as (second, _):
                    pass
            services = [p.service for p in mirror.policies.values()]
            assert len(services) == 3 and all(s._bucket is mirror.upload_bucket for s in services)  # one node cap
            mirror.adopt(signed_version(tmp_path, key, 3), local_dir=tmp_path / "v3")
            assert not directory.exists() and not second.exists()  # v0 and v1 left the window
            nursery.cancel_scope.cancel()


async def test_an_announced_version_is_fetched_over_the_announcing_channel_without_a_new_dial(tmp_path,
                                                                                              autojump_clock):
    """The larger peer holds a version first and, once the smaller peer has not dialed its link for a second,
    announces it over its spare channel; the smaller peer, whose link that is to dial, writes its preamble back on
    the same channel and fetches the version over it: no dial of its own, no spare of its own used (each cost a
    data channel per announced version before)."""
    key = Identity.generate()
    source = signed_version(tmp_path, key, 0)
    small_dials: list[str] = []

    async def small_dial(peer):
        small_dials.append(peer)
        raise OSError("the smaller peer must not dial")

    async def big_dial(peer):
        await trio.sleep_forever()  # big's next spare: never needed here

    with PieceStore(tmp_path / "big", keep_versions=2) as big_store, \
            PieceStore(tmp_path / "small", keep_versions=2) as small_store:
        trust = TrainerTrust("r", key.public_bytes, tmp_path)
        big = PolicyMirror(big_store, "peer-b", trust, run="r", keep=2)
        small = PolicyMirror(small_store, "peer-a", trust, run="r", keep=2)
        async with trio.open_nursery() as nursery:
            await nursery.start(big.run_service)
            await nursery.start(small.run_service)
            policy = big.adopt(source, local_dir=tmp_path / "v0")
            ours, theirs = trio.testing.memory_stream_pair()
            big.spares._spares["peer-a"] = (ours, trio.current_time() + big.spares.ttl)
            nursery.start_soon(small.accept_link, "peer-b", theirs)  # the acceptor side of big's spare
            await trio.sleep(0.5)
            await big.reconcile(["peer-a"], big_dial, max_links=8)  # the smaller peer may still dial on its own
            assert "peer-a" not in policy.announced
            await trio.sleep(0.5)
            await big.reconcile(["peer-a"], big_dial, max_links=8)  # it has not: big announces over its spare
            assert "peer-a" in policy.announced
            with trio.fail_after(30):
                while policy.manifest.id not in small.policies:
                    await trio.sleep(0.1)
                fetched = small.policies[policy.manifest.id]
                await fetched.service.completed.wait()
            assert small_dials == [] and policy.service.peers == ["peer-a"] and fetched.service.peers == ["peer-b"]
            await small.reconcile(["peer-b"], small_dial, max_links=8)  # the pair is linked: no link to dial
            await trio.sleep(0.1)
            assert small_dials == ["peer-b"] and fetched.failures == {}  # one dial: the spare it keeps, no link
            nursery.cancel_scope.cancel()
        out = small_store.reassemble(fetched.manifest, tmp_path / "out")
        assert (out / "model.safetensors").read_bytes() == (tmp_path / "v0" / "model.safetensors").read_bytes()


def test_a_peer_that_left_is_reported_once_for_all_its_versions_and_a_liar_is_banned(tmp_path):
    """A peer that leaves ends its links of every version at once: one line, not one per version; it is news again
    once it has linked since. A breach of the protocol bans the peer from every version."""
    from types import SimpleNamespace

    key = Identity.generate()
    events = []
    with PieceStore(tmp_path / "store") as store:
        mirror = PolicyMirror(store, "me", TrainerTrust("r", key.public_bytes, tmp_path), run="r",
                              on_event=events.append)
        v1, v2 = (SimpleNamespace(manifest=SimpleNamespace(version=v), dropped=set(), opened=set()) for v in (1, 2))
        for policy in (v1, v2):
            mirror._dropped(policy, "gone", "its link broke", hostile=False)
        mirror._linked(v2, "gone", dir="in")
        mirror._dropped(v2, "gone", "its link broke", hostile=False)
        mirror._dropped(v1, "liar", "sent a corrupt piece 3", hostile=True)
    drops = [(e.dropped, e.version, e.banned) for e in events if isinstance(e, PeerDropped)]
    assert drops == [("gone", 1, False), ("gone", 2, False), ("liar", 1, True)]
    assert mirror.banned == {"liar": "sent a corrupt piece 3"}


async def test_a_first_use_key_is_trusted_only_from_a_verified_manifest_of_this_run(tmp_path, autojump_clock):
    """Without --trainer-key the first signer is pinned, only after the checks: forged bytes or another run's
    manifest pinned on disk would make every real manifest refused from then on."""
    import msgpack

    trainer, mallory = Identity.generate(), Identity.generate()
    forged = msgpack.packb({"m": b"garbage", "k": mallory.public_bytes, "s": bytes(64)}, use_bin_type=True)
    (tmp_path / "other").mkdir()
    save_file({"w": np.zeros(8, dtype=np.float32)}, str(tmp_path / "other" / "model.safetensors"))
    (tmp_path / "other" / "model.json").write_text("{}")
    other_run = build_manifest(tmp_path / "other", run="another", version=1, parent_version=None, created_at=0.0,
                               generation=GenerationSettings(2, 1.0, 8, 0), piece_size=262144)
    other_signed = sign_manifest(other_run, mallory.sign, mallory.public_bytes).to_bytes()
    trust = TrainerTrust("r", None, tmp_path / "data")
    with PieceStore(tmp_path / "store") as store:
        mirror = PolicyMirror(store, "me", trust, run="r")
        async with trio.open_nursery() as nursery:
            await nursery.start(mirror.run_service)
            assert mirror.adopt(forged) is None and mirror.adopt(other_signed) is None
            assert trust.key is None and not list((tmp_path / "data").glob("trainer-key-*"))
            assert mirror.adopt(signed_version(tmp_path, trainer, 0)) is not None
            assert trust.key == trainer.public_bytes
            nursery.cancel_scope.cancel()


async def test_channels_naming_an_unknown_manifest_count_against_the_peers_waiting_limit(tmp_path, autojump_clock):
    """A channel keeps its place in the waiting limit while it waits for its manifest, not only until its preamble
    is read: otherwise one peer keeps 200 channels open at once, each naming an id nobody knows, for the whole
    adoption wait."""
    from swarm.policy.inbound_links import MAX_WAITING_PER_PEER

    key = Identity.generate()
    with PieceStore(tmp_path / "store") as store:
        mirror = PolicyMirror(store, "me", TrainerTrust("r", key.public_bytes, tmp_path), run="r", adoption_wait=30.0)
        async with trio.open_nursery() as nursery:
            await nursery.start(mirror.run_service)
            ends = []
            for i in range(10):
                ours, theirs = trio.testing.memory_stream_pair()
                await theirs.send_all(bytes([i]) * 32 + (0).to_bytes(4, "big"))  # an unknown id, no manifest
                nursery.start_soon(mirror.accept_link, "a-smaller-peer", ours)
                ends.append(theirs)
            await trio.sleep(1.0)
            assert mirror.inbound._waiting["a-smaller-peer"] == MAX_WAITING_PER_PEER  # the others were turned away
            await trio.sleep(30.0)  # the adoption wait ends: nothing adopted, every channel given up
            assert mirror.inbound._waiting.get("a-smaller-peer", 0) == 0
            nursery.cancel_scope.cancel()


async def test_with_a_pinned_key_another_signers_manifest_is_refused_before_it_is_decoded(tmp_path, autojump_clock,
                                                                                          monkeypatch):
    """Decoding a manifest costs time and memory in proportion to its (up to 32 MiB) body: with the key known, a
    stranger's manifest is refused on its signer alone."""
    trainer, mallory = Identity.generate(), Identity.generate()
    with PieceStore(tmp_path / "store") as store:
        mirror = PolicyMirror(store, "me", TrainerTrust("r", trainer.public_bytes, tmp_path), run="r")

        def must_not_decode(*_args):
            raise AssertionError("a stranger's manifest was decoded")

        async with trio.open_nursery() as nursery:
            await nursery.start(mirror.run_service)
            monkeypatch.setattr("swarm.policy.mirror.verify_manifest", must_not_decode)
            assert mirror.adopt(signed_version(tmp_path, mallory, 0)) is None
            nursery.cancel_scope.cancel()
