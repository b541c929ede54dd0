"""Which inbound TCP connections the host does the work of a connection for: a node-wide admission rate.

Why: identities are free, and every new inbound connection costs the node far more than its messages do: the
Noise handshake (key agreement and signature checks), Yamux, identify both ways, pubsub's hello, the replay of its
recent messages to the newcomer, and what the peer gets in before a ban. A crowd of fresh identities arriving one
after another would make the node spend that again for each. So, node-wide and whatever the number of identities:
- every inbound TCP connection takes a token from the `handshakes` bucket before its Noise handshake starts; the
  excess is closed at once, which costs an accept and a close;
- after the handshake (the first point the remote's peer id is proven), a peer the node does not know yet takes
  a token from the much smaller `strangers` bucket before Yamux, identify and pubsub run; the excess is closed.

A peer is known once this host dialed it (bootstrap peers, peers found through the DHT), or once its first admitted
inbound connection is `known_after_s` old; a ban forgets it. Known peers pass the strangers bucket. Outbound dials
and relayed (circuit) connections are not gated here: they never come through the TCP listener.

`InboundAdmission` is pure state (time is passed in); `gate_inbound` installs it on a py-libp2p host.
"""

from __future__ import annotations

import collections
import logging
import math
import weakref
from dataclasses import dataclass

import trio
from libp2p.abc import IHost, IRawConnection, ISecureConn, ReadWriteCloser
from libp2p.peer.id import ID
from libp2p.transport.exceptions import SecurityUpgradeFailure
from multiaddr import Multiaddr

from p2p.ratelimit import Allowance

log = logging.getLogger(__name__)

OUTBOUND = -math.inf
"""The admission time recorded for a peer this host dialed: known from the start."""


@dataclass(frozen=True)
class InboundLimits:
    """The node-wide rates; the defaults keep a crowd's connections to a few percent of a core."""

    handshakes_per_s: float = 32.0
    handshakes_burst: float = 64.0
    strangers_per_s: float = 2.0
    strangers_burst: float = 64.0
    known_after_s: float = 60.0
    max_tracked: int = 4096
    """Peers remembered (least recently admitted forgotten first); a crowd adds at most `strangers_per_s` a second."""


class InboundAdmission:
    """The decisions; counts of what was refused for metrics and benches."""

    def __init__(self, limits: InboundLimits = InboundLimits()) -> None:
        self.limits = limits
        self._handshakes = Allowance(limits.handshakes_per_s, limits.handshakes_burst)
        self._strangers = Allowance(limits.strangers_per_s, limits.strangers_burst)
        self._admitted: collections.OrderedDict[str, float] = collections.OrderedDict()
        self.refused = {"handshakes_busy": 0, "strangers_busy": 0}

    def admit_handshake(self, now: float) -> bool:
        """Whether an inbound connection may start its handshake (its peer is not known yet)."""
        if self._handshakes.take(1, now):
            return True
        self.refused["handshakes_busy"] += 1
        return False

    def is_known(self, peer: str, now: float) -> bool:
        since = self._admitted.get(peer)
        return since is not None and now - since >= self.limits.known_after_s

    def admit_peer(self, peer: str, now: float) -> bool:
        """Whether the authenticated `peer` may have its connection muxed and served."""
        if self.is_known(peer, now):
            self._admitted.move_to_end(peer)
            return True
        if not self._strangers.take(1, now):
            self.refused["strangers_busy"] += 1
            return False
        self._note(peer, self._admitted.get(peer, now))
        return True

    def dialed(self, peer: str) -> None:
        """This host connected out to `peer`: it is known from now on."""
        self._note(peer, OUTBOUND)

    def forget(self, peer: str) -> None:
        """A banned peer is a stranger again."""
        self._admitted.pop(peer, None)

    def _note(self, peer: str, since: float) -> None:
        self._admitted[peer] = since
        self._admitted.move_to_end(peer)
        while len(self._admitted) > self.limits.max_tracked:
            self._admitted.popitem(last=False)


def gate_inbound(libp2p_host: IHost, admission: InboundAdmission) -> InboundAdmission:
    """Install `admission` on a py-libp2p host: its TCP listener's connections and their security upgrade."""
    swarm = libp2p_host.get_network()
    handle_inbound = swarm._handle_inbound_connection
    upgrade_security = swarm.upgrader.upgrade_security
    # The TCP listener's sockets (held weakly): only their upgrades are gated, not those of relayed connections,
    # which py-libp2p may run in tasks descending from a TCP connection's.
    via_listener: weakref.WeakSet = weakref.WeakSet()

    async def gated_connection(read_write_closer: ReadWriteCloser, maddr: Multiaddr) -> None:
        if not admission.admit_handshake(trio.current_time()):
            log.debug("inbound connection refused before its handshake: the node's handshake rate is spent")
            try:
                await read_write_closer.close()
            except Exception:  # noqa: BLE001 - the socket may be gone already
                pass
            return
        via_listener.add(read_write_closer)
        await handle_inbound(read_write_closer, maddr)

    async def gated_security(raw_conn: IRawConnection, is_initiator: bool, peer_id: ID | None = None) -> ISecureConn:
        secured = await upgrade_security(raw_conn, is_initiator, peer_id)
        peer = str(secured.get_remote_peer())
        if is_initiator:
            admission.dialed(peer)
        elif getattr(raw_conn, "stream", None) in via_listener and not admission.admit_peer(peer, trio.current_time()):
            try:
                await secured.close()
            except Exception:  # noqa: BLE001 - the peer may have hung up already
                pass
            raise SecurityUpgradeFailure(f"stranger {peer} refused: the node's rate for new peers is spent")
        return secured

    swarm._handle_inbound_connection = gated_connection
    swarm.upgrader.upgrade_security = gated_security
    return admission
