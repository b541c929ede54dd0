"""The policy mirror's window: a version pushed out of it while a link to it was being dialed takes no new link."""

from __future__ import annotations

import json

import numpy as np
import pytest
import trio
import trio.testing
from safetensors.numpy import save_file

from p2p.identity import Identity
from p2p.manifest import GenerationSettings, build_manifest, sign_manifest
from p2p.store import PieceStore
from swarm.mirror import PolicyMirror
from swarm.trust import TrainerTrust


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
        mirror = PolicyMirror(store, "me", TrainerTrust("r", key.public_bytes, tmp_path), run="r", keep=2)
        async with trio.open_nursery() as nursery:
            await nursery.start(mirror.run_service)
            oldest = mirror.adopt(signed_version(tmp_path, key, 0))
            ours, theirs = trio.testing.memory_stream_pair()
            dialed = trio.Event()

            async def dial(peer):
                dialed.set()
                await trio.sleep(1.0)  # virtual time; meanwhile two newer versions push v0 out of the window
                return ours

            nursery.start_soon(mirror._dial_link, oldest, "peer", dial)
            await dialed.wait()
            for version in (1, 2):
                mirror.adopt(signed_version(tmp_path, key, version))
            assert oldest.manifest.id not in mirror.policies
            await trio.sleep(2.0)  # virtual time; before the fix: RuntimeError "Nursery is closed to new arrivals" here
            assert "peer" not in oldest.service.peers
            assert await theirs.receive_some(1 << 16)  # the preamble went out, then our end was closed
            nursery.cancel_scope.cancel()


async def test_an_expired_spare_is_closed_cleanly_and_a_vanished_dialer_is_no_error(tmp_path, autojump_clock):
    """An expired spare used to be dropped unclosed, so its acceptor saw a truncated channel and logged a warning;
    now it is closed (a clean end), and an acceptor whose dialer vanishes before the preamble just stops."""
    from p2p.errors import ChannelError

    key = Identity.generate()
    with PieceStore(tmp_path / "store", keep_versions=2) as store:
        mirror = PolicyMirror(store, "me", TrainerTrust("r", key.public_bytes, tmp_path), run="r", keep=2,
                              spare_ttl=10.0)
        async with trio.open_nursery() as nursery:
            await nursery.start(mirror.run_service)
            ours, theirs = trio.testing.memory_stream_pair()
            mirror._spares["peer"] = (ours, trio.current_time())
            await trio.sleep(11.0)  # virtual time: past the spare's lifetime
            assert mirror._take_spare("peer", trio.current_time()) is None
            with trio.fail_after(1):
                assert await theirs.receive_some(1024) == b""  # closed, not left to the garbage collector

            class Truncated:
                async def receive_some(self, max_bytes=None):
                    raise ChannelError("data channel from peer ended without its final record (truncated)")

            with trio.fail_after(1):
                assert await mirror.accept_link("peer", Truncated()) is None  # quietly, no exception
            assert mirror._waiting["peer"] == 0
            nursery.cancel_scope.cancel()


async def test_a_version_being_reassembled_is_held_out_of_garbage_collection(tmp_path, autojump_clock):
    """A slow peer reassembled a version in a worker thread while newer versions pushed it out of the window, and
    the store closed and deleted its files under the reading thread. Held, it stays (files included) until read."""
    from types import SimpleNamespace

    from swarm.policy_files import PolicyLeftWindow, materialize

    key = Identity.generate()
    with PieceStore(tmp_path / "store", keep_versions=2) as store:
        mirror = PolicyMirror(store, "me", TrainerTrust("r", key.public_bytes, tmp_path), run="r", keep=2)
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
            node = SimpleNamespace(mirror=mirror, config=SimpleNamespace(data_dir=tmp_path / "peer"))
            with pytest.raises(PolicyLeftWindow, match="left the window"):
                await materialize(node, oldest)
            nursery.cancel_scope.cancel()
