"""Events of the policy mirror: versions adopted, moved, completed and dropped, and the data links between peers
(swarm.policy.mirror)."""

from __future__ import annotations

from dataclasses import dataclass

from swarm.event_types.base import Event, optional


@dataclass(frozen=True, kw_only=True)
class Refused(Event):
    """A manifest was refused (another run's, a key that is not the trainer's); said at most once a minute."""

    kind = "refused"
    reason: str  # why, with how many more were refused since the last report

    def line(self) -> str:
        return f"warning: refused: {self.reason}"


@dataclass(frozen=True, kw_only=True)
class Adopted(Event):
    """A new version's manifest is accepted: its pieces start moving."""

    kind = "adopted"
    version: int  # the policy version
    id: str  # the manifest id, hex
    bytes: int  # the policy's size
    pieces: int  # how many pieces it has

    def line(self) -> str:
        return f"policy v{self.version} announced: {self.bytes / 2**20:.1f} MiB in {self.pieces} pieces"


@dataclass(frozen=True, kw_only=True)
class TransferProgress(Event):
    """A version's transfer, every status period (swarm.node.node): pieces held and the rates since the last."""

    kind = "progress"
    version: int  # the policy version
    pieces: int  # pieces held and verified
    total: int  # pieces of the version
    up_mib_s: float  # upload rate since the last report
    down_mib_s: float  # download rate since the last report
    peers: int  # peers linked for this version
    up_bytes: int = 0  # bytes uploaded so far
    down_bytes: int = 0  # bytes downloaded so far

    def line(self) -> str:
        pct = 100.0 * self.pieces / max(1, self.total)
        return (f"policy v{self.version}: {self.pieces}/{self.total} pieces ({pct:.0f}%), "
                f"up {self.up_mib_s:.1f} MiB/s, down {self.down_mib_s:.1f} MiB/s, "
                f"{self.peers} peer{'' if self.peers == 1 else 's'}")


@dataclass(frozen=True, kw_only=True)
class Complete(Event):
    """Every piece of a version is held and verified: this peer seeds it."""

    kind = "complete"
    version: int  # the policy version
    id: str  # the manifest id, hex

    def line(self) -> str:
        return f"policy v{self.version} complete and verified; seeding it"


@dataclass(frozen=True, kw_only=True)
class Dropped(Event):
    """A version left the window of kept versions; its files are collected."""

    kind = "dropped"
    version: int  # the policy version

    def line(self) -> str:
        return f"policy v{self.version} left the window; garbage-collected"


@dataclass(frozen=True, kw_only=True)
class PeerDropped(Event):
    """A version's transfer dropped a peer; a hostile one is banned from every version."""

    kind = "peer_dropped"
    version: int  # the policy version whose service dropped it
    dropped: str  # the peer's id
    reason: str  # why (a corrupt piece, a stall, a closed stream)
    banned: bool  # whether it is never linked again

    def line(self) -> str:
        return (f"dropped peer {self.dropped} from policy v{self.version}: {self.reason}"
                + ("; it is not linked again" if self.banned else ""))


@dataclass(frozen=True, kw_only=True)
class Link(Event):
    """A data link for one version was opened."""

    kind = "link"
    peer: str  # the other peer's id
    version: int  # the policy version
    dir: str  # "in" (it dialed) or "out" (this peer dialed)
    via: str | None = optional()  # "announcement" when opened over the peer's announced stream
    dial_s: float | None = optional()  # seconds the dial took, for links this peer dialed
    spare: bool | None = optional()  # whether a spare channel carried it, for links this peer dialed


@dataclass(frozen=True, kw_only=True)
class Spare(Event):
    """A spare data channel to a peer is open, ready for its next version."""

    kind = "spare"
    peer: str  # the other peer's id


@dataclass(frozen=True, kw_only=True)
class DhtFound(Event):
    """The run's newest version was found through the DHT, which means gossip missed it."""

    kind = "dht_found"
    version: int  # the version the DHT's record names
    providers: int  # peers that said they hold it

    def line(self) -> str:
        return f"found policy v{self.version} through the DHT (gossip missed it)"
