"""How often a peer heartbeats: a budget per run shared by the peers of each kind, not a fixed period.

Pure numbers and two functions, read by the node's peer table (swarm.node.state) and its heartbeat loop
(swarm.node.gossip).
"""

from __future__ import annotations

from collections.abc import Iterable

COUNTED_ROLES = frozenset({"trainer", "validator"})
"""Roles whose presence others count: the trainer names the validators it hears in each version, and a validator
that left must drop out of that set within a bounded silence."""
FULL_RATE_COUNTED = 4
"""Up to this many known peers of the counted roles, each heartbeats every `heartbeat_every_s`; past it, each
stretches its period (and the silence after which others forget it) in proportion, so the run's validators and
trainer together send about FULL_RATE_COUNTED / heartbeat_every_s heartbeats a second (0.67 by default) however
many they are: with 16 validators a 25 s period, and one that left is forgotten after about two minutes."""
FULL_RATE_OTHERS = 1
"""The same for every other peer (inference, seed): about 0.17 heartbeats a second from all of them together. Their
presence only feeds discovery (which the DHT and bootstrap peers also serve) and the trainer's "is anyone
generating" check (any one of them answers it), so in a run of 1,000 each may be heard from every 100 minutes; at
3 they took a third of what heartbeats cost a peer of 1,000 (swarm.bench.scale), for nothing anyone waits on.

Why budgets per run instead of a fixed period: a heartbeat floods the whole run, and every flooded message costs
each peer a pubsub RPC from and to most of its mesh neighbours, about 4-5 ms of CPU (swarm.bench.scale). At a fixed
6 s period a 1,000-peer run would hand each peer 167 heartbeats a second; with one budget of 24 full-rate peers for
every role, 4 a second, about 2 % of a core by themselves."""
MAX_KNOWN_PEERS = 4096
"""Peers whose heartbeats a node remembers (roles, when last heard); past it the least recently heard is forgotten.
Identities are free, so the table is bounded; the stretch counts at most this many peers, so a flood of fresh
identities can slow heartbeats by at most MAX_KNOWN_PEERS / FULL_RATE_OTHERS."""
MAX_STRETCHING_COUNTED = 64
"""Counted-role peers that stretch heartbeats at most: anyone may claim to be a validator, and a crowd of such
claims must not slow the real validators' heartbeats (and the trainer's notice of one that left) past 16 times."""


def is_counted(roles: Iterable[str]) -> bool:
    """Whether a peer with `roles` heartbeats on the counted roles' budget."""
    return not COUNTED_ROLES.isdisjoint(roles)


def heartbeat_stretch(peers_known: int, counted: bool, named: int = 0) -> float:
    """How much longer than `heartbeat_every_s` (and `peer_silence_s`) a peer of the counted roles or not waits,
    `peers_known` others of its kind being known and, for the counted roles, `named` of them named by the newest
    signed version (its validators and its trainer).

    Why the named ones count past MAX_STRETCHING_COUNTED: claims alone may stretch the counted roles' period by at
    most 16x, so past 64 validators their heartbeats would grow with the run again (100 validators: 1.04 a second
    to every peer instead of 0.67). Only the run's key names validators, so the size of the set it names stretches
    the period as far as it needs, and every peer of the run reads the same number."""
    full_rate, most = (FULL_RATE_COUNTED, MAX_STRETCHING_COUNTED) if counted else (FULL_RATE_OTHERS, MAX_KNOWN_PEERS)
    known = min(peers_known, most)
    if counted:
        known = max(known, min(named, MAX_KNOWN_PEERS))
    return max(1.0, (known + 1) / full_rate)
