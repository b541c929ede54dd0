"""Turning a complete, verified policy version into files a model can load, once per version."""

from __future__ import annotations

import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import trio

from inference.models import load_model
from swarm.errors import UserError
from swarm.policy.mirror_view import MirrorView
from swarm.policy.mirrored import MirroredPolicy
from swarm.policy.runspec import RunSpec, VersionTasks, version_tasks


class PolicyLeftWindow(Exception):
    """The version left the mirrored window before it could be reassembled: skip it, a newer one is there."""


async def materialize(mirror: MirrorView, policy: MirroredPolicy) -> Path:
    """Reassemble `policy` (verified piece by piece) under data_dir/policies/v<N>-<id>; reuse it if already there.

    Its files are held out of garbage collection while a worker thread reads them; a version already dropped
    raises PolicyLeftWindow (versions turn over every few seconds while a slow peer catches up). The copy is
    deleted when the version leaves the mirror's window, so hold the version (`open_version`) while loading it."""
    target = mirror.copy_dir(policy)
    if not (target / ".complete").exists():
        with mirror.holding(policy):
            if not mirror.is_mirrored(policy):
                raise PolicyLeftWindow(f"policy v{policy.manifest.version} left the window before it was reassembled")
            await trio.to_thread.run_sync(mirror.store.reassemble, policy.manifest, target)
        (target / ".complete").write_text("ok\n")
    return target


class VersionUnusable(Exception):
    """A version a role must skip (the message says why in one line): it left the window before it could be
    reassembled, or its tasks cannot be read."""


@asynccontextmanager
async def open_version(mirror: MirrorView, spec: RunSpec, policy: MirroredPolicy
                       ) -> AsyncIterator[tuple[Path, VersionTasks]]:
    """(directory, VersionTasks) of a complete version: its files reassembled and its tasks read from them, as
    inference peers and validators both need; raises VersionUnusable instead of failing the role.

    The version is held inside the block, so its files stay on disk while the caller loads them."""
    with mirror.holding(policy):
        try:
            directory = await materialize(mirror, policy)
        except PolicyLeftWindow as exc:
            raise VersionUnusable(str(exc)) from None
        try:
            tasks = await trio.to_thread.run_sync(version_tasks, spec, policy.manifest, directory)
        except UserError as exc:
            raise VersionUnusable(f"v{policy.manifest.version}: {exc}") from None
        yield directory, tasks


async def newest_complete(mirror: MirrorView, newer_than: int) -> MirroredPolicy:
    """Wait for a complete policy version newer than `newer_than` and return the newest such one."""
    while True:
        done = [p for p in mirror.complete_versions() if p.manifest.version > newer_than]
        if done:
            return done[-1]
        await mirror.changed.wait()


_LOAD_LOCK = threading.Lock()


async def load_base_model(spec: str):
    """Load a base model in a worker thread, one load at a time.

    Why the lock: transformers resolves its classes lazily on first import, and several roles of one process
    loading at once from different threads race inside that machinery (an ImportError in one of them).
    """

    def load():
        with _LOAD_LOCK:
            return load_model(spec)

    return await trio.to_thread.run_sync(load)
