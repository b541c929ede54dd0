"""What a role reads of the policy mirror: a Protocol, so a role depends on the versions it uses, not on how the
mirror links peers and moves pieces."""

from __future__ import annotations

from contextlib import AbstractContextManager
from pathlib import Path
from typing import Protocol

import trio

from p2p.pieces.store import PieceStore
from swarm.policy.mirrored import MirroredPolicy


class MirrorView(Protocol):
    """The mirror's side a role uses (swarm.policy.mirror.PolicyMirror): the versions held, a wake-up when they
    change, their files while a worker thread reads them, and the trainer's adoption of the versions it publishes."""

    policies: dict[bytes, MirroredPolicy]
    store: PieceStore
    changed: trio.Event  # set, and replaced, whenever a version is adopted or completes

    def copy_dir(self, policy: MirroredPolicy) -> Path: ...

    def latest(self) -> MirroredPolicy | None: ...

    def complete_versions(self) -> list[MirroredPolicy]: ...

    def is_mirrored(self, policy: MirroredPolicy) -> bool: ...

    def holding(self, policy: MirroredPolicy) -> AbstractContextManager[None]: ...

    def adopt(self, signed: bytes, local_dir: Path | None = None) -> MirroredPolicy | None: ...
