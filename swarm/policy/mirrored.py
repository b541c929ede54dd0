"""One policy version a peer mirrors: its manifest, its piece service and the state of its links.

Kept apart from the mirror (swarm.policy.mirror) and the link rules (mirror_dial, mirror_places), which all read and
write it, so none of them imports another to name it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import trio

from p2p.pieces.manifest import PolicyManifest
from p2p.pieces.transfer import SwarmService


@dataclass
class MirroredPolicy:
    """One policy version this peer follows."""

    manifest: PolicyManifest
    signed: bytes
    origin: str  # peer id of the trainer that signed it
    service: SwarmService | None = None
    scope: trio.CancelScope | None = None
    dialing: set[str] = field(default_factory=set)  # links we dial, and announcements waiting for an answer
    failures: dict[str, float] = field(default_factory=dict)  # peer -> time of last failed dial
    announced: dict[str, float] = field(default_factory=dict)  # smaller peers we handed the manifest to -> when
    dropped: set[str] = field(default_factory=set)  # peers this version's service dropped: linked again only last
    opened: set[str] = field(default_factory=set)  # peers whose link this peer opened (dialed, or announced)
    released: set[str] = field(default_factory=set)  # peers whose link idled: re-admitted only if trusted
    admitting: dict[str, float] = field(default_factory=dict)  # peers admitted whose link is not served yet -> when
    providers: set[str] = field(default_factory=set)  # peers the DHT's signed provider records name for it
    tended_at: float = -math.inf  # when its links were last looked at (mirror_places)
    announced_complete: bool = False
    adopted_at: float = 0.0  # trio time this peer adopted it
    ready: trio.Event = field(default_factory=trio.Event)  # its full files are held (fetched, or rebuilt from a patch)
    parent: MirroredPolicy | None = None  # the version its patch applies to, when this peer fetches the patch
