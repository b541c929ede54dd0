"""The swarm engine's actions: what it tells the IO adapter (p2p/pieces/transfer.py) to do, in order, after each event.

Frozen values only; the engine (p2p/pieces/engine.py) decides, the adapter carries out.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Union

from p2p.pieces.wire import Cancel, Have, Reject, Request


@dataclass(frozen=True)
class Send:
    """Send a control message (have, request, cancel, reject) to `peer`."""

    peer: str
    message: Union[Have, Request, Cancel, Reject]


@dataclass(frozen=True)
class SendPiece:
    """Read piece `index` from the store and send it to `peer`; report back with `upload_done`."""

    peer: str
    index: int


@dataclass(frozen=True)
class StorePiece:
    """The piece just received (and verified by the adapter) is wanted: write it to the store."""

    index: int


@dataclass(frozen=True)
class DropPeer:
    """Close the link to `peer`; the engine has already forgotten it.

    `hostile`: it broke the protocol (a corrupt or unsolicited piece, a flood), so it is not linked again; a merely
    slow or silent peer (False) may be tried again later."""

    peer: str
    reason: str
    hostile: bool = True


@dataclass(frozen=True)
class Completed:
    """Every piece is held: the policy can be reassembled (seeding goes on)."""


Action = Union[Send, SendPiece, StorePiece, DropPeer, Completed]
