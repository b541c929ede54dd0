"""The secure host factory: one py-libp2p host per peer, Noise only, Yamux only, guarded handlers.

Why a wrapper around py-libp2p's BasicHost (docs/reference.md#py-libp2p-pitfalls, each seen here):
- its security defaults accept a plaintext dialer, so we pass Noise as the ONLY security option, with a dedicated
  X25519 Noise static key;
- Mplex is 4x slower than Yamux, so Yamux is the only muxer;
- every dial costs 250 ms unless `max_connections_per_peer=1`;
- its auto-connector dials known peers until it holds 200 connections, so its watermarks are set low here
  (AUTO_CONNECT_BELOW): a peer tops itself up to 16, and p2p.host.conn_trim keeps the count near `max_peers`
  (py-libp2p's own pruner never closes a connection with a stream, which gossip keeps on all);
- an exception escaping a stream handler kills the host and the trio run around it, so every handler we install
  is wrapped: exceptions and hangs are logged and the stream reset, and an unexpected exception costs the peer
  that opened the stream score (`P2PHost.faults`); a peer past the ban threshold is disconnected and its streams
  refused until the ban ends, so a peer cannot keep tripping a handler bug;
- an unreachable bootstrap peer must be one log line, not a traceback, and must not stop the host.
Other packages (gossip, DHT) reach the raw libp2p host through `P2PHost.libp2p`.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path

import trio
from libp2p import new_host
from libp2p.abc import IHost, INetStream, ITransport
from libp2p.crypto.x25519 import create_new_key_pair as new_x25519
from libp2p.custom_types import TProtocol
from libp2p.network.config import ConnectionConfig
from libp2p.peer.id import ID
from libp2p.peer.peerinfo import info_from_p2p_addr
from libp2p.security.noise.transport import PROTOCOL_ID as NOISE_ID
from libp2p.security.noise.transport import Transport as NoiseTransport
from libp2p.stream_muxer.yamux.yamux import PROTOCOL_ID as YAMUX_ID
from libp2p.stream_muxer.yamux.yamux import Yamux
from multiaddr import Multiaddr

from p2p.bootstrap import peer_id_of
from p2p.errors import HostError
from p2p.host.addresses import check_listen_ports_free, dialable, interface_ips
from p2p.host.closing import close_sockets
from p2p.host.conn_trim import libp2p_peers_in_use
from p2p.host.dial_pacing import DialPacer, pace_dials
from p2p.host.inbound_admission import InboundAdmission, InboundLimits, gate_inbound
from p2p.host.inbound_cap import count_open_inbound
from p2p.identity import Identity, load_or_create_identity
from p2p.libp2p_compat import cache_signed_records, index_service_tasks, read_tcp_ahead, tune_yamux
from p2p.reach.probe import ReachConfig
from p2p.reach.relay import is_circuit
from p2p.reach.service import ReachState, open_reach
from p2p.scores import PeerScores, ScoreConfig, Verdict
from p2p.stream_guard import (
    StreamHandler,
    _one_line,
    _stream_peer,
    guard_handler,
    peer_went_away,
    read_exactly,
    reset_quietly,
)

__all__ = ["CONFIG_DEFAULT", "HANDLER_FAULT", "HostConfig", "P2PHost", "ensure_connected", "guard_handler",
           "open_host", "peer_went_away", "read_exactly", "reset_quietly"]

log = logging.getLogger(__name__)

DEFAULT_LISTEN = ("/ip4/127.0.0.1/tcp/0",)


class _ConfigDefault:
    """Marker: use the host config's value (None already means "no limit")."""


CONFIG_DEFAULT = _ConfigDefault()
HANDLER_FAULT = "handler_fault"
AUTO_CONNECT_BELOW = 8
"""py-libp2p's low watermark: with AUTO_CONNECT_UP_TO, its auto-connector dials known peers while this peer holds
(or is dialing) fewer than their midpoint, 16 connections."""
AUTO_CONNECT_UP_TO = 24
"""py-libp2p's high watermark: past it, its own pruner closes connections that carry no stream at all (gossip keeps
one on every swarm peer) after 20 s; p2p.host.conn_trim bounds the rest."""
FAULT_SCORES = ScoreConfig(penalties={HANDLER_FAULT: 25.0})
"""Three unexpected handler errors from one peer within a minute or two ban it (score -75 against the -60
threshold; scores decay with a 120 s half-life), for the default ban time (600 s)."""


@dataclass(frozen=True)
class HostConfig:
    """How to build a host. Every timeout is in seconds of trio time."""

    identity: Identity | None = None
    """The peer's key; None loads (or creates) `data_dir/identity.key`, or a fresh key without a data_dir."""
    data_dir: Path | None = None
    """Where the identity is persisted so the peer id survives restarts."""
    listen: tuple[str, ...] = DEFAULT_LISTEN
    """Multiaddrs to listen on; port 0 picks a free port (the actual one is in `P2PHost.multiaddrs`)."""
    bootstrap: tuple[str, ...] = ()
    """Validated multiaddrs with /p2p/<id> (see p2p.bootstrap.resolve_bootstrap) dialed once at start."""
    announce: tuple[str, ...] = ()
    """Multiaddrs to tell others instead of the listen addresses (a public address behind NAT or a port forward);
    empty: the listen addresses, an unspecified IP (0.0.0.0, ::) expanded to the machine's interface addresses."""
    dial_timeout: float = 10.0
    """Limit on one dial (TCP + Noise + Yamux negotiation)."""
    stream_timeout: float = 10.0
    """Limit on opening one stream (including protocol negotiation)."""
    handler_timeout: float | None = 60.0
    """Default limit on one inbound stream handler; a handler may ask for another or None (it then owns timeouts)."""
    reach: ReachConfig = ReachConfig()
    """Reachability check, relaying for others and through others, hole punching (p2p/reach/probe.py)."""
    inbound: InboundLimits = InboundLimits()
    """Node-wide rates of inbound handshakes and of new peers served (p2p/host/inbound_admission.py)."""

    def __post_init__(self) -> None:
        if not self.listen:
            raise HostError("a host needs at least one listen multiaddr")
        for addr in self.listen:
            protocols = [p.name for p in _parse_multiaddr(addr).protocols()]
            if protocols[:1] not in (["ip4"], ["ip6"]) or protocols[1:] != ["tcp"]:
                raise HostError(f"listen address {addr!r} must be /ip4/IP/tcp/PORT or /ip6/IP/tcp/PORT "
                                f"(peers speak TCP only)")
        for addr in self.announce:
            _parse_multiaddr(addr)
            if "/p2p/" in addr:
                raise HostError(f"announce address {addr!r} must not name a peer id (/p2p/...): it is added")
        for name in ("dial_timeout", "stream_timeout"):
            if getattr(self, name) <= 0:
                raise HostError(f"{name} must be positive, got {getattr(self, name)}")
        if self.handler_timeout is not None and self.handler_timeout <= 0:
            raise HostError(f"handler_timeout must be positive or None, got {self.handler_timeout}")


def _resolve_identity(config: HostConfig) -> Identity:
    if config.identity is not None:
        return config.identity
    if config.data_dir is not None:
        return load_or_create_identity(config.data_dir)
    return Identity.generate()


def _parse_multiaddr(text: str) -> Multiaddr:
    try:
        return Multiaddr(text)
    except Exception as exc:  # noqa: BLE001 - the multiaddr library raises many types for bad input
        raise HostError(f"{text!r} is not a valid multiaddr ({exc})") from exc


def build_libp2p_host(identity: Identity, listen: Sequence[str], transports: Sequence[ITransport] | None = None):
    """A BasicHost with Noise-only security (own X25519 key), Yamux-only muxing and one connection per peer."""
    # The TCP transport logs every refused dial at ERROR, several times per retry; our one-line
    # "bootstrap peer unreachable" warning replaces that noise.
    logging.getLogger("libp2p.transport.tcp.tcp").setLevel(logging.CRITICAL)
    tune_yamux()  # without it every small read sends a window update: twice the frames for gossip's small RPCs
    index_service_tasks()  # without it each task py-libp2p starts walks all of its service's tasks
    cache_signed_records()  # without it pubsub re-checks our signed peer record for every message it sends
    read_tcp_ahead()  # without it every Noise message costs two socket reads, three when it has not arrived yet
    key_pair = identity.key_pair
    noise = NoiseTransport(libp2p_keypair=key_pair, noise_privkey=new_x25519().private_key)
    host = new_host(
        key_pair=key_pair,
        sec_opt={NOISE_ID: noise},
        muxer_opt={YAMUX_ID: Yamux},
        listen_addrs=[_parse_multiaddr(a) for a in listen],
        connection_config=ConnectionConfig(max_connections_per_peer=1, min_connections=AUTO_CONNECT_BELOW // 2,
                                           low_watermark=AUTO_CONNECT_BELOW, high_watermark=AUTO_CONNECT_UP_TO),
        transports=transports,
    )
    host.multiselect.handlers = _HandlerTable(host.multiselect.handlers)
    pace_dials(host, DialPacer())  # remote claims (identify, DHT answers, announcements) name what it dials
    count_open_inbound(host.get_network())  # else each inbound connection ever accepted keeps a place of its cap
    return host


class _HandlerTable(dict):
    """py-libp2p's multiselect table of stream handlers, safe against removal during a negotiation.

    Multiselect checks `protocol in handlers`, awaits its reply to the peer, then looks the handler up again: a
    handler removed in between (a DHT or data channel closing while a peer opens a stream to it) raises KeyError
    in the connection's task and kills the host. Here the late lookup finds a handler that resets the stream.
    """

    def __missing__(self, protocol: TProtocol) -> StreamHandler:
        return reset_quietly

    def __getitem__(self, protocol: TProtocol) -> StreamHandler:
        """Every handler contained, py-libp2p's own ones (identify, ping) too: at teardown identify asked a closed
        listener for its address (EBADF) and the error ended the host's service instead of that one stream."""
        return _contained(protocol, super().__getitem__(protocol))


def _contained(protocol: TProtocol, handler: StreamHandler) -> StreamHandler:
    async def contained(stream: INetStream) -> None:
        try:
            await handler(stream)
        except Exception as exc:  # noqa: BLE001 - one stream's failure costs that stream only
            log.debug("handler for %s failed: %s", protocol, exc)
            await reset_quietly(stream)

    return contained


@dataclass
class P2PHost:
    """A running host. Create it with `open_host`; it closes when that context exits."""

    libp2p: IHost
    identity: Identity
    config: HostConfig
    nursery: trio.Nursery
    bootstrap_failures: dict[str, str] = field(default_factory=dict)
    faults: PeerScores = field(default_factory=lambda: PeerScores(FAULT_SCORES))
    """Scores of the peers whose streams made a guarded handler fail unexpectedly; a banned peer is refused."""
    fault_listeners: list[Callable[[str, str], None]] = field(default_factory=list)
    """Called with (peer id, protocol) on each such fault, e.g. to fold it into the node's own peer scores."""
    reach: ReachState | None = None
    """The reachability service's state (p2p.reach.service.ReachState) once the host is open."""
    inbound: InboundAdmission = field(default_factory=InboundAdmission)
    """What inbound connections the host serves; a banned peer is forgotten there (a stranger again)."""
    _interface_ips: dict[str, list[str]] | None = None  # looked up once, on first use of `multiaddrs`

    @property
    def peer_id(self) -> str:
        return self.identity.peer_id

    @property
    def multiaddrs(self) -> list[str]:
        """Addresses to hand to another peer, each ending in /p2p/<peer id>: the `announce` addresses, else the
        listen addresses with an unspecified IP expanded to this machine's (p2p.host.addresses), loopback last."""
        if self.config.announce:
            return [self._with_id(a) for a in self.config.announce]
        if self.reach is not None and self.reach.relayed_addrs:  # private: only relays reach us
            return [self._with_id(a) for a in self.reach.relayed_addrs]
        if self._interface_ips is None:
            self._interface_ips = interface_ips()
        return [self._with_id(a) for a in dialable(self.bound_multiaddrs, self._interface_ips)]

    @property
    def bound_multiaddrs(self) -> list[str]:
        """The listen addresses as bound (0.0.0.0 stays 0.0.0.0), with the actual ports; for binding other sockets
        beside them, never to give out."""
        return [str(a) for a in self.libp2p.get_transport_addrs()]

    def _with_id(self, addr: str) -> str:
        suffix = f"/p2p/{self.peer_id}"
        if is_circuit(addr):  # /.../p2p/<relay>/p2p-circuit: the relay's id stays
            return addr if addr.endswith(suffix) else addr + suffix
        base = addr.split("/p2p/")[0]
        return base + suffix

    async def connect(self, multiaddr: str) -> str:
        """Dial `multiaddr` (which must end in /p2p/<id>) and return the remote peer id; HostError on failure."""
        try:
            info = info_from_p2p_addr(_parse_multiaddr(multiaddr))
        except HostError:
            raise
        except Exception as exc:  # noqa: BLE001
            raise HostError(f"{multiaddr!r} lacks a usable /p2p/<peer id> part ({exc})") from exc
        try:
            with trio.fail_after(self.config.dial_timeout):
                if is_circuit(multiaddr) and self.reach is not None:
                    await self.reach.relaying.dial(multiaddr)
                else:
                    await self.libp2p.connect(info)
        except trio.TooSlowError as exc:
            raise HostError(f"dialing {multiaddr} timed out after {self.config.dial_timeout:g} s") from exc
        except Exception as exc:  # noqa: BLE001 - libp2p raises a zoo of dial errors; one sentence for the user
            raise HostError(f"cannot reach {multiaddr}: {_one_line(exc)}") from exc
        return str(info.peer_id)

    async def redial(self, multiaddr: str) -> str:
        """`connect`, even when py-libp2p still remembers a failed dial to that peer.

        Why: py-libp2p refuses for 60 s every dial to a peer whose addresses all failed once (its negative cache).
        A bootstrap peer redialed on purpose (it restarted, or was not up yet) would be refused for that minute.
        """
        peer = peer_id_of(multiaddr)
        try:
            self.libp2p.get_network().unblock_peer(ID.from_base58(peer))
        except Exception as exc:  # noqa: BLE001 - a malformed id: connect names the problem in one line
            log.debug("cannot clear the failed-dial record of %s: %s", peer, exc)
        return await self.connect(multiaddr)

    async def new_stream(self, peer_id: str, protocol: str):
        """Open a stream to a connected (or known) peer on `protocol`; HostError on failure or timeout."""
        try:
            with trio.fail_after(self.config.stream_timeout):
                return await self.libp2p.new_stream(ID.from_base58(peer_id), [protocol])
        except trio.TooSlowError as exc:
            raise HostError(f"opening {protocol} to {peer_id} timed out") from exc
        except Exception as exc:  # noqa: BLE001
            raise HostError(f"cannot open {protocol} to {peer_id}: {_one_line(exc)}") from exc

    def set_guarded_handler(
        self, protocol: str, handler: StreamHandler, timeout: float | None | _ConfigDefault = CONFIG_DEFAULT,
        *, idle_streams: bool = False,
    ) -> None:
        """Install `handler(stream)` so that its exception or hang is logged and the stream reset, never fatal.

        `timeout` bounds the whole handler (default: `HostConfig.handler_timeout`); None is for long-lived
        protocols (gossip, data channels) whose handlers enforce their own per-operation timeouts.
        `idle_streams`: the protocol lets a peer keep its stream open between requests (Kademlia does), so a
        handler still running at `timeout` is an idle stream being closed, logged at debug level, not a hang.
        """
        limit = self.config.handler_timeout if isinstance(timeout, _ConfigDefault) else timeout
        guarded = guard_handler(protocol, handler, limit, idle_streams=idle_streams, admit=self.admits,
                                on_fault=self.handler_fault)
        self.libp2p.set_stream_handler(protocol, guarded)

    def admits(self, stream: INetStream) -> bool:
        """Whether a stream's peer may be served: not while banned for repeated handler faults."""
        peer = _stream_peer(stream)
        return peer is None or not self.faults.is_banned(peer, trio.current_time())

    def handler_fault(self, stream: INetStream, protocol: str) -> None:
        """Penalise the peer whose stream made a handler fail unexpectedly; past the threshold, disconnect it."""
        peer = _stream_peer(stream)
        if peer is None or peer == self.peer_id:
            return
        now = trio.current_time()
        newly = not self.faults.is_banned(peer, now)
        verdict = self.faults.penalize(peer, HANDLER_FAULT, now)
        for listener in self.fault_listeners:
            listener(peer, protocol)
        if verdict is Verdict.BAN and newly:
            log.warning("peer %s banned for %g s after repeated handler faults", peer, self.faults.config.ban_s)
            self.inbound.forget(peer)
            self.nursery.start_soon(self._disconnect, peer)

    async def _disconnect(self, peer: str) -> None:
        with trio.move_on_after(self.config.stream_timeout):
            try:
                await self.libp2p.disconnect(ID.from_base58(peer))
            except Exception as exc:  # noqa: BLE001 - the peer may be gone already; its streams are refused anyway
                log.debug("disconnecting banned peer %s failed: %s", peer, _one_line(exc))

    async def disconnect(self, peer: str) -> None:
        """Close our connections to `peer` (bounded by `stream_timeout`; a peer already gone is not an error)."""
        await self._disconnect(peer)

    def peers_in_use(self) -> set[str]:
        """Peers whose connection carries more than gossip (p2p.host.conn_trim.libp2p_peers_in_use): trimming never
        closes these."""
        relaying = self.reach.relaying if self.reach is not None else None
        return libp2p_peers_in_use(self.libp2p.get_network(), relaying.protocol if relaying else None,
                                   relaying.reservations if relaying else ())

    def remove_handler(self, protocol: str) -> None:
        """Stop serving `protocol` (peers are told it is not supported; see `_HandlerTable` for the race)."""
        self.libp2p.remove_stream_handler(protocol)

    def connected_peers(self) -> list[str]:
        """The ids of the peers with an open connection, sorted."""
        return sorted(str(p) for p in self.libp2p.get_connected_peers())

    def connection_counts(self) -> dict[str, int]:
        """Open connections: total, inbound and outbound (py-libp2p's own Swarm.get_metrics), for metrics."""
        return {str(k): int(v) for k, v in self.libp2p.get_network().get_metrics().items()}

    def remote_peer_id(self, stream: INetStream) -> str:
        """The authenticated (Noise) peer id at the other end of a libp2p stream."""
        return str(stream.muxed_conn.peer_id)


async def ensure_connected(host: P2PHost, peer_id: str, addrs: Sequence[str]) -> None:
    """Connect to `peer_id` through the first of `addrs` (its announced multiaddrs) that answers, unless already
    connected; when none answers, the request that follows says so."""
    if peer_id in {str(p) for p in host.libp2p.get_connected_peers()}:
        return
    for addr in addrs:
        try:
            await host.connect(addr)
            return
        except HostError as exc:
            log.debug("announced address %s unreachable: %s", addr, exc)


async def _dial_bootstrap(host: P2PHost, addr: str) -> None:
    try:
        await host.connect(addr)
    except HostError as exc:
        host.bootstrap_failures[addr] = str(exc)
        log.info("bootstrap peer unreachable: %s", exc)  # reported by whoever opened the host, in one line


@asynccontextmanager
async def open_host(
    config: HostConfig | None = None, transports: Sequence[ITransport] | None = None
) -> AsyncIterator[P2PHost]:
    """Start a host, dial the bootstrap peers (failures kept in `bootstrap_failures` for the caller to report, never
    fatal), yield it, close it on exit."""
    config = config or HostConfig()
    identity = _resolve_identity(config)
    check_listen_ports_free(config.listen)
    libp2p_host = build_libp2p_host(identity, config.listen, transports)
    listen = [_parse_multiaddr(a) for a in config.listen]
    bound = True
    async with AsyncExitStack() as stack:
        try:
            await stack.enter_async_context(libp2p_host.run(listen_addrs=listen))
        except Exception as exc:  # noqa: BLE001 - a busy port or bad interface: one sentence, not a traceback
            raise HostError(f"cannot listen on {', '.join(config.listen)}: {_one_line(exc)}") from exc
        stack.push_async_callback(close_sockets, libp2p_host)  # runs before the libp2p host's own exit
        bound = bool(libp2p_host.get_addrs())  # py-libp2p logs a failed bind (an IP not of this machine), runs deaf
        if bound:
            nursery = await stack.enter_async_context(trio.open_nursery())
            # The host's tasks are cancelled on exit only once the reachability service has closed: its close
            # awaits, and an await inside a cancelled scope raises Cancelled, which would replace a
            # KeyboardInterrupt unwinding through here and then be swallowed by that very scope (Ctrl-C would end
            # the peer as if its work were done).
            stack.callback(nursery.cancel_scope.cancel)
            host = P2PHost(libp2p_host, identity, config, nursery,
                           inbound=gate_inbound(libp2p_host, InboundAdmission(config.inbound)))
            async with trio.open_nursery() as dials:
                for addr in config.bootstrap:
                    dials.start_soon(_dial_bootstrap, host, addr)
            host.reach = await stack.enter_async_context(open_reach(host))
            yield host
    if not bound:  # said once the deaf host is closed, so it is not wrapped in its nursery's exception group
        raise HostError(f"cannot listen on {', '.join(config.listen)}: no address could be bound (is the IP one of "
                        "this machine's?)")
