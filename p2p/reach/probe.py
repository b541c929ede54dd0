"""Reachability: does anyone reach this peer directly? If not, relays and hole punching.

A peer asks its bootstrap peers to dial it back (DIALBACK_PROTOCOL below). Why our own dial-back and not
py-libp2p's AutoNAT (`libp2p.host.autonat`): its server dials back with `host.connect`, which returns the
connection the request came on, so every peer that asks is told it is public. Ours opens a fresh TCP connection to
the address the request came from (the observed IP, never one the asker names: no amplification) on the asker's
listen port and checks that a libp2p listener answers there (the multistream-select header).

- public (some answered yes): announce the listen addresses, serve as a relay within `RelayLimits`;
- private (every answer no): reserve a slot on up to `max_relays` relays among the bootstrap peers and announce
  `<relay addr>/p2p-circuit/p2p/<me>`; peers dial those through the relay (p2p.reach.relay), and DCUtR (py-libp2p's
  `DCUtRProtocol`: a synchronised simultaneous TCP open from the listen port, coordinated over the relayed stream)
  replaces the relayed connection by a direct one where the NATs allow it, driven from one end only
  (`punch_targets`);
- unknown (nobody answered: a first bootstrap peer has nobody to ask): treated as public.
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import trio

from p2p.errors import HostError
from p2p.ratelimit import Allowance
from p2p.reach.punch_guard import MAX_PUNCH_ATTEMPTS, MAX_PUNCHES_AT_ONCE
from p2p.reach.relay_limits import RelayLimits, connection_kind
from p2p.stream_guard import read_exactly

if TYPE_CHECKING:
    from libp2p.abc import INetStream

log = logging.getLogger(__name__)

DIALBACK_PROTOCOL = "/rl-swarm/dialback/1.0.0"
MULTISTREAM = b"\x13/multistream/1.0.0\n"
"""What a libp2p TCP listener answers first (the varint length, then the multistream-select header)."""
_YES, _NO, _REFUSED = b"\x01", b"\x00", b"\x02"
"""A refusal (out of dial-backs, or a relayed asker) is no verdict: a stranger spending a server's dial-backs must
not make honest peers believe they are private."""


class Reachability(enum.Enum):
    PUBLIC = "public"
    PRIVATE = "private"
    UNKNOWN = "unknown"


@dataclass(frozen=True)
class ReachConfig:
    """How a peer finds out whether it is reachable, and what it does about it. Seconds are trio time."""

    mode: str = "auto"
    """"auto": ask the bootstrap peers to dial back; "public" or "private": skip the check and act as told."""
    dial_back_timeout_s: float = 3.0
    """A dial-back that has not reached the asker within this counts as "not reachable" (firewalls drop silently)."""
    dial_backs_per_s: float = 4.0
    """Dial-backs this peer performs for others per second (bursts of 8); past it a request is refused."""
    recheck_s: float = 10.0
    """How often a peer that could ask nobody at start (its bootstrap peers unreachable then) asks again once one is
    connected: without it, a bootstrap dial that times out under load leaves a private peer announcing an address
    nobody can dial, for good."""
    max_relays: int = 2
    """Relays a private peer holds a reservation on (each gives it one relayed address)."""
    hole_punch: bool = True
    """Upgrade relayed connections to direct ones by hole punching (DCUtR) where the NATs allow it."""
    relay: RelayLimits = RelayLimits()
    """What this peer grants others when it is public and serves as a relay."""

    def __post_init__(self) -> None:
        if self.mode not in ("auto", "public", "private"):
            raise HostError(f"reachability mode must be auto, public or private, got {self.mode!r}")
        if min(self.dial_back_timeout_s, self.dial_backs_per_s, self.recheck_s) <= 0 or self.max_relays < 0:
            raise HostError("dial-back timeout, rate and recheck time must be positive, max_relays at least 0")


def verdict(answers: Sequence[bool | None]) -> Reachability:
    """Reachability from the dial-back answers (None: that peer did not answer). One yes is enough: a server
    cannot dial back an address that does not reach us; a no may be one server's own firewall, so it takes all."""
    if any(a is True for a in answers):
        return Reachability.PUBLIC
    if any(a is False for a in answers):
        return Reachability.PRIVATE
    return Reachability.UNKNOWN


MAX_PUNCH_ADDRS = 8
"""Addresses of a peer's DCUtR message decoded at all (a 4 KiB message holds hundreds); p2p.reach.punch_guard admits
fewer still to a session's dials."""


def punch_targets(me: str, links: Mapping[str, Sequence[tuple[bool, bool]]], punching: Collection[str],
                  attempts: Mapping[str, int]) -> list[str]:
    """The peers to start a hole punch to now, from each peer's connections as (relayed, we dialed it): those reached
    only through relays, over a connection they dialed (over connections both ends dialed: by the end whose peer id
    sorts first), not being punched already, with attempts left (`attempts`: sessions with each within
    p2p.reach.punch_guard.PUNCH_WINDOW_S, reconnects or not); at most MAX_PUNCHES_AT_ONCE under way.

    Why one end only (the dialed end, as the DCUtR spec has it, and go-libp2p does): when both ends start a session
    at once, both sessions dial between the same two listen ports, as opposite handshake roles; the dials collide
    (one `connect` fails with EADDRNOTAVAIL, the TCP connection the other opens fails its security handshake) round
    after round, and the pair stays relayed."""

    def ours(peer: str, conns: Sequence[tuple[bool, bool]]) -> bool:
        if not conns or not all(relayed for relayed, _ in conns):
            return False
        they_dialed = any(not dialed for _, dialed in conns)
        return they_dialed and (all(not dialed for _, dialed in conns) or me < peer)

    wanted = [peer for peer, conns in links.items()
              if ours(peer, conns) and peer not in punching and attempts.get(peer, 0) < MAX_PUNCH_ATTEMPTS]
    return wanted[:max(0, MAX_PUNCHES_AT_ONCE - len(punching))]


def decode_port(raw: bytes) -> int:
    """The asker's listen port (2 bytes, big-endian); HostError for anything else, and for port 0."""
    if len(raw) != 2:
        raise HostError(f"a dial-back request is 2 bytes, got {len(raw)}")
    port = int.from_bytes(raw, "big")
    if port == 0:
        raise HostError("a dial-back request named port 0")
    return port


async def probe_listener(ip: str, port: int, timeout: float) -> bool:
    """Whether a libp2p listener answers a fresh TCP connection to ip:port within `timeout`."""
    with trio.move_on_after(timeout):
        try:
            stream = await trio.open_tcp_stream(ip, port)
        except OSError:
            return False
        async with stream:
            got = b""
            try:
                await stream.send_all(MULTISTREAM)
                while len(got) < len(MULTISTREAM):
                    chunk = await stream.receive_some(len(MULTISTREAM) - len(got))
                    if not chunk:
                        return False
                    got += chunk
            except (OSError, trio.BrokenResourceError):
                return False
            return got == MULTISTREAM
    return False


class DialBackServer:
    """Answers dial-back requests: dials the observed IP of the request's connection, never another."""

    def __init__(self, config: ReachConfig) -> None:
        self.config = config
        self._allowance = Allowance(config.dial_backs_per_s, 8)
        self.refused = 0

    async def handle(self, stream: INetStream) -> None:
        port = decode_port(await read_exactly(stream, 2))
        remote = stream.get_remote_address()
        if (not remote or connection_kind(stream.muxed_conn) == "relayed"
                or not self._allowance.take(1, trio.current_time())):
            self.refused += 1
            await stream.write(_REFUSED)
            await stream.close()
            return
        ok = await probe_listener(remote[0], port, self.config.dial_back_timeout_s)
        await stream.write(_YES if ok else _NO)
        await stream.close()


class StreamOpener(Protocol):
    """What asking for a dial-back takes of a host (p2p.host.p2p_host.P2PHost; p2p.reach.host_view.ReachHost has it,
    but imports this module)."""

    async def new_stream(self, peer_id: str, protocol: str) -> INetStream: ...


async def ask_dial_back(host: StreamOpener, peer: str, port: int, timeout: float) -> bool | None:
    """Ask `peer` to dial us back on `port`; its answer, or None when it gave none in time."""
    with trio.move_on_after(timeout):
        try:
            stream = await host.new_stream(peer, DIALBACK_PROTOCOL)
            await stream.write(port.to_bytes(2, "big"))
            answer = await read_exactly(stream, 1)
            await stream.close()
        except Exception as exc:  # noqa: BLE001 - a peer without the protocol, or gone: no answer
            log.debug("no dial-back answer from %s: %s", peer, exc)
            return None
        return {_YES: True, _NO: False}.get(answer)  # anything else (a refusal) is no verdict
    return None
