"""Gossip bodies of the `vote` kind: a validator's votes on one batch travel together, each still signed alone.

Why batches: every gossip message floods the whole run (each peer receives it from several mesh neighbours) and
costs py-libp2p about 2.5 ms of CPU per delivery, whatever its size; one message per vote made a validator's
traffic grow with its batch, 12 messages per policy version in the default simulation and hundreds per batch on a
GPU validator. A body holds up to MAX_VOTES votes within VOTE_BYTES; the trainer still checks every vote's
signature and that its validator is the message's sender, so batching changes no trust.

Body: {"votes": [vote wire dict, ...]}. The single-vote body {"vote": wire} is read too.
"""

from __future__ import annotations

from collections.abc import Iterable

import msgpack

from verify.votes import Vote, VoteError

MAX_VOTES = 256
"""Votes in one message at most (a receiver refuses longer lists unread)."""
VOTE_BYTES = 48 * 1024
"""Encoded votes per message at most: a batch is split below the `vote` envelope limit (p2p.gossip.envelope, 64 KiB)."""


def vote_bodies(votes: Iterable[Vote]) -> list[dict]:
    """The gossip bodies carrying `votes`, in order, each within MAX_VOTES and VOTE_BYTES."""
    bodies: list[dict] = []
    batch: list[dict] = []
    size = 0
    for vote in votes:
        wire = vote.to_wire()
        wire_size = len(msgpack.packb(wire, use_bin_type=True))
        if batch and (len(batch) == MAX_VOTES or size + wire_size > VOTE_BYTES):
            bodies.append({"votes": batch})
            batch, size = [], 0
        batch.append(wire)
        size += wire_size
    if batch:
        bodies.append({"votes": batch})
    return bodies


def votes_in(body: object) -> tuple[list[Vote], int]:
    """(the votes that parse, how many entries did not) from a hostile body; signatures are checked later."""
    if isinstance(body, dict) and "votes" in body:
        wires = body["votes"]
        if not isinstance(wires, list) or not 0 < len(wires) <= MAX_VOTES:
            return [], 1
    elif isinstance(body, dict):
        wires = [body.get("vote")]
    else:
        return [], 1
    votes, malformed = [], 0
    for wire in wires:
        try:
            votes.append(Vote.from_wire(wire))
        except VoteError:
            malformed += 1
    return votes, malformed
