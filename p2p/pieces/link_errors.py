"""How a piece-protocol link ended, in the two ways its callers need: a breach or not, and a sentence for a person.

Why apart from p2p/pieces/transfer.py: the adapter only moves bytes; deciding whether a peer broke the protocol (banned)
or merely left or stalled (may come back) is a rule of its own, shared by every link.
"""

from __future__ import annotations

import trio

from p2p.errors import ChannelError, ChannelTamperedError, FrameError, FrameTruncatedError


def is_breach(exc: BaseException) -> bool:
    """Whether a link's error shows the peer broke the protocol (malformed frames, forged records), as opposed to
    leaving mid-piece or stalling: a killed peer leaves a truncated frame or record, and may come back."""
    if isinstance(exc, FrameError):
        return not isinstance(exc, FrameTruncatedError)
    return isinstance(exc, ChannelTamperedError)


def link_failure(exc: BaseException) -> str:
    """Why a link ended, in words for a person: a peer that vanished, stalled or broke the protocol."""
    if isinstance(exc, (trio.BrokenResourceError, trio.ClosedResourceError)):
        return f"its link broke (the peer left or its connection dropped{': ' + str(exc) if str(exc) else ''})"
    if isinstance(exc, trio.TooSlowError):
        return "it stopped answering within the protocol's timeouts"
    if isinstance(exc, FrameTruncatedError):
        return f"it left mid-piece: {exc}"
    if isinstance(exc, FrameError):
        return f"it broke the piece protocol: {exc}"
    if isinstance(exc, ChannelTamperedError):
        return f"its data channel carried forged or tampered bytes: {exc}"
    if isinstance(exc, ChannelError):
        return f"its data channel failed (the peer left or its connection dropped): {exc}"
    return str(exc) or type(exc).__name__


def first_leaf(group: BaseExceptionGroup) -> BaseException:
    exc: BaseException = group
    while isinstance(exc, BaseExceptionGroup):
        exc = exc.exceptions[0]
    return exc
