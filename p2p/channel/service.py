"""The fast data channel: libp2p authenticates and hands over a one-time key and token, bytes move on a TCP socket.

Why: a py-libp2p Noise+Yamux stream moves about 0.25x of raw TCP; a plain trio socket carrying AEAD records of up
to 1 MiB (a piece payload each) moves about 0.5x here, the AEAD being most of the rest (channel_records.py).
Security rests on the libp2p stream: the offer (port, token, secret) travels inside Noise to the authenticated
peer only, the token admits exactly one socket once, and the record key is derived from the secret AND both peer
ids, so a channel is bound to the two peers libp2p authenticated. When the data socket cannot be reached (relays,
NAT), the same libp2p protocol carries the bytes itself (`Libp2pByteStream`), slower but always there; that
fallback is logged once per peer.

Handshake on PROTOCOL (u16 length + one message of p2p/channel/messages.py each way): the dialer's request (socket
or stream, and how many tickets it would like), the listener's offer (port, token, secret, cipher, tickets). The
dialer connects to the listener's IP (the one its libp2p connection reached) and port and sends the token; the
listener answers with one empty record ("accepted") or drops the socket at once. In stream mode the libp2p stream
itself becomes the data channel. The next channels to the same listener skip the handshake while the dialer holds
a ticket: a connect and a token (p2p.channel.tickets says why that is as safe).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeAlias

import blake3
from libp2p.abc import INetStream
import trio

from p2p.channel.addresses import is_loopback, listen_ip, note_socket_unreachable, remote_ip, socket_reachable
from p2p.channel.config import ChannelConfig
from p2p.channel.handshake import MSG_LEN, HandshakeAbandoned, close_quietly, read_msg, write_msg
from p2p.channel.messages import (
    MAX_TICKETS, TOKEN_BYTES, ChannelOffer, ChannelRequest, HandshakeBreach, decode_offer,
    decode_request, encode_offer, encode_request,
)
from p2p.channel.records import (
    AEADS, DIALER, KEY_BYTES, LISTENER, RecordOpener, RecordSealer, choose_aead, preferred_aead,
)
from p2p.channel.host_view import ChannelHost
from p2p.channel.stream import SecureChannelStream, tune_socket
from p2p.channel.tickets import Ticket, TicketBook, ticket_secret
from p2p.errors import ChannelError
from p2p.libp2p_compat import Libp2pByteStream, tune_yamux
from p2p.ratelimit import Allowance

log = logging.getLogger(__name__)

PROTOCOL = "/rl-swarm/data/1.0.0"
_KEY_CONTEXT = "rl-swarm 2026 data channel v1 record key"
DataChannel: TypeAlias = SecureChannelStream | Libp2pByteStream
"""An open data channel: the fast data socket, or the libp2p stream where the socket is unreachable."""
ChannelCallback = Callable[[str, DataChannel], Awaitable[None]]
_fallback_logged: set[str] = set()


def channel_key(secret: bytes, dialer: str, listener: str) -> bytes:
    """The record key: bound to the one-time secret and to both authenticated peer ids."""
    material = b"".join(MSG_LEN.pack(len(p)) + p for p in (secret, dialer.encode(), listener.encode()))
    return blake3.blake3(material, derive_key_context=_KEY_CONTEXT).digest(length=KEY_BYTES)


# ------------------------------------------------------------------------------------------- listener side


@dataclass
class _Offer:
    """An unclaimed token, an offer's own or a ticket: whose it is, its channel's secret and cipher, its expiry."""

    peer_id: str
    secret: bytes
    aead: str
    expires: float


class DataChannelServer:
    """Accepts data channels for one host: libp2p handshakes, the data socket listener, token admission."""

    def __init__(self, host: ChannelHost, callback: ChannelCallback, config: ChannelConfig = ChannelConfig()) -> None:
        self.host = host
        self.callback = callback
        self.config = config
        self.port = 0
        self._offers: dict[bytes, _Offer] = {}
        self._tickets: dict[bytes, _Offer] = {}  # token -> the ticket's peer, secret and expiry (oldest first)
        self.rejected = 0
        self.aead = config.aead or preferred_aead()
        self._pending_sockets, self._open_channels = 0, 0
        self._pending_by_ip: dict[str, int] = {}
        self.refused_channels = 0  # handshakes refused because max_channels were open
        self._handshakes = Allowance(config.handshakes_per_s, config.handshake_burst)
        self.refused_handshakes = 0  # handshakes refused because the node-wide handshake rate was spent
        self.ticket_channels = 0  # channels admitted with a ticket (no handshake of their own)

    @property
    def pending_sockets(self) -> int:
        """Data sockets connected but not yet admitted (their token not yet checked)."""
        return self._pending_sockets

    async def run(self, *, task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED) -> None:
        """Listen on the host's IP, install the handshake handler, serve until cancelled."""
        ip = listen_ip(self.host.bound_multiaddrs)  # 0.0.0.0 when libp2p listens on every interface
        listeners = await trio.open_tcp_listeners(0, host=ip)
        self.port = listeners[0].socket.getsockname()[1]
        self.host.set_guarded_handler(PROTOCOL, self._handle_handshake, timeout=None)
        async with trio.open_nursery() as nursery:
            task_status.started(self.port)
            try:
                await trio.serve_listeners(self._admit_guarded, listeners, handler_nursery=nursery)
            finally:
                self.host.remove_handler(PROTOCOL)

    @property
    def open_channels(self) -> int:
        """Data channels being served now (either transport)."""
        return self._open_channels

    async def _handle_handshake(self, stream: INetStream) -> None:
        if not self._handshakes.take(1, trio.current_time()):
            self.refused_handshakes += 1  # counted, not logged: a line each would cost what the refusal saves
            await close_quietly(stream)
            return
        peer_id = self.host.remote_peer_id(stream)
        with trio.fail_after(self.config.handshake_timeout):
            try:
                request = decode_request(await read_msg(stream, opening=True))
            except HandshakeAbandoned:
                log.debug("peer %s closed a data channel handshake before sending it", peer_id)
                return
        self._expire_offers()
        if self._open_channels >= self.config.max_channels:
            self.refused_channels += 1
            log.debug("refused a data channel of %s: %d channels open", peer_id, self._open_channels)
            await close_quietly(stream)  # the dialer reads an end at once, not a silence until its timeout
            return
        if request.mode == "stream":
            tune_yamux()
            await self._serve(peer_id, Libp2pByteStream(stream, peer_id))
            return
        await self._make_offer(stream, peer_id, request)

    async def _make_offer(self, stream: INetStream, peer_id: str, request: ChannelRequest) -> None:
        aead = choose_aead(self.aead, None if request.aeads is None else list(request.aeads))
        token, secret = os.urandom(TOKEN_BYTES), os.urandom(KEY_BYTES)
        if sum(o.peer_id == peer_id for o in self._offers.values()) >= self.config.max_offers_per_peer:
            raise ChannelError(f"peer {peer_id} holds too many unclaimed data channel offers")
        if len(self._offers) >= self.config.max_channels:  # strangers' unclaimed offers must not lock others out
            del self._offers[next(iter(self._offers))]
        now = trio.current_time()
        self._offers[token] = _Offer(peer_id, secret, aead, now + self.config.token_ttl)
        tickets = self._grant_tickets(peer_id, secret, aead, min(request.tickets, self.config.tickets_per_offer), now)
        ticket_s = int(self.config.ticket_ttl) if tickets else 0
        offer = encode_offer(ChannelOffer(self.port, token, secret, aead, tuple(tickets), ticket_s))
        with trio.fail_after(self.config.handshake_timeout):
            try:
                await write_msg(stream, offer)
            except HandshakeAbandoned:
                self._offers.pop(token, None)  # never delivered: nobody can claim them
                for ticket in tickets:
                    self._tickets.pop(ticket, None)
                log.debug("peer %s reset a data channel handshake before our offer", peer_id)
                return
            await stream.close()

    def _grant_tickets(self, peer_id: str, secret: bytes, aead: str, count: int, now: float) -> list[bytes]:
        """`count` new tickets for `peer_id`, each with its own secret; past `max_tickets_per_peer` its oldest go,
        past `max_tickets` anyone's oldest. Why never refused: a dialer loses track of tickets (a connect that
        failed, a refused one, a restart), and tickets it will never use must not lock it out of offers."""
        if count <= 0:
            return []
        held = [t for t, o in self._tickets.items() if o.peer_id == peer_id]
        for stale in held[:max(0, len(held) + count - self.config.max_tickets_per_peer)]:
            del self._tickets[stale]
        tickets = [os.urandom(TOKEN_BYTES) for _ in range(count)]
        for ticket in tickets:
            while len(self._tickets) >= self.config.max_tickets:
                del self._tickets[next(iter(self._tickets))]
            self._tickets[ticket] = _Offer(peer_id, ticket_secret(secret, ticket), aead, now + self.config.ticket_ttl)
        return tickets

    def _expire_offers(self) -> None:
        now = trio.current_time()
        for held in (self._offers, self._tickets):
            for token in [t for t, o in held.items() if o.expires < now]:
                del held[token]

    async def _admit_guarded(self, sock: trio.SocketStream) -> None:
        """Nothing a stranger sends to the data port may escape into the host's nursery."""
        ip = remote_ip(sock)
        if self.config.exempt_loopback and is_loopback(ip):
            ip = ""  # no per-IP limit: counted under "" only for the bookkeeping, never refused for its IP
        if (self._pending_sockets >= self.config.max_pending_sockets
                or (ip and self._pending_by_ip.get(ip, 0) >= self.config.max_pending_per_ip)):
            self.rejected += 1
            await trio.aclose_forcefully(sock)
            return
        try:
            await self._admit(sock, ip)
        except Exception as exc:  # noqa: BLE001 - log and drop; the listener keeps serving
            log.warning("data socket dropped: %s", _why(exc))
            await trio.aclose_forcefully(sock)

    def _release_ip(self, ip: str) -> None:
        """One pending socket of `ip` presented its token or failed."""
        left = self._pending_by_ip.get(ip, 0) - 1
        if left > 0:
            self._pending_by_ip[ip] = left
        else:
            self._pending_by_ip.pop(ip, None)

    async def _admit(self, sock: trio.SocketStream, ip: str) -> None:
        """Admit a data socket only with a live one-time token; anything else is dropped at once."""
        self._pending_sockets += 1
        self._pending_by_ip[ip] = self._pending_by_ip.get(ip, 0) + 1
        try:
            with trio.fail_after(self.config.handshake_timeout):
                try:
                    with trio.fail_after(self.config.token_timeout):
                        offer = await self._claim_token(sock)
                finally:  # a socket past its token holds no place of its IP's (a peer keeps many channels)
                    self._release_ip(ip)
                if offer is None:
                    self.rejected += 1
                    log.info("dropped a data socket with an unknown or expired token")
                    await trio.aclose_forcefully(sock)
                    return
                keys = _ChannelKeys(offer.secret, offer.aead, offer.peer_id, self.host.peer_id)
                channel = _make_stream(sock, keys, LISTENER, self.config)
                await channel.send_accept()
        except (trio.TooSlowError, ChannelError, trio.BrokenResourceError, OSError) as exc:
            log.warning("data socket handshake failed: %s", _why(exc))
            await trio.aclose_forcefully(sock)
            return
        finally:
            self._pending_sockets -= 1
        await self._serve(offer.peer_id, channel)

    async def _claim_token(self, sock: trio.SocketStream) -> _Offer | None:
        token = bytearray()
        while len(token) < TOKEN_BYTES:
            data = await sock.receive_some(TOKEN_BYTES - len(token))
            if not data:
                return None
            token += data
        now, key = trio.current_time(), bytes(token)
        is_ticket = key not in self._offers
        offer = (self._tickets if is_ticket else self._offers).pop(key, None)
        if offer is None or offer.expires < now or self._open_channels >= self.config.max_channels:
            return None
        if is_ticket:
            if not self._ticket_admitted(offer, now):
                return None
            self.ticket_channels += 1
        return offer

    def _ticket_admitted(self, ticket: _Offer, now: float) -> bool:
        """Whether an unexpired ticket opens a channel now: its peer still connected over libp2p and not banned (a
        ticket outlives its offer by minutes, and a peer banned or gone since must not come back through it), and
        within the node's handshake rate, which a ticket spends like the handshake it saves (so tickets never let
        channels open faster than handshakes did)."""
        faults = getattr(self.host, "faults", None)
        if faults is not None and faults.is_banned(ticket.peer_id, now):
            return False
        if ticket.peer_id not in self.host.connected_peers():
            return False
        if not self._handshakes.take(1, now):
            self.refused_handshakes += 1
            return False
        return True

    async def _serve(self, peer_id: str, channel: DataChannel) -> None:
        """Run the user's callback; its failure ends this channel only, never the host."""
        self._open_channels += 1
        try:
            await self.callback(peer_id, channel)
        except Exception as exc:  # noqa: BLE001 - a handler bug or a hostile peer must not kill the host
            log.warning("data channel handler for %s failed: %s", peer_id, _why(exc))
            log.debug("data channel handler traceback", exc_info=True)
        finally:
            self._open_channels -= 1
            await channel.aclose()


def _why(exc: BaseException) -> str:
    """An error's message, or its type when it has none (a timeout's message is empty)."""
    return str(exc) or type(exc).__name__


@dataclass(frozen=True)
class _ChannelKeys:
    """What both ends of one data channel agree on after the offer."""

    secret: bytes
    aead: str
    dialer: str
    listener: str


def _make_stream(sock: trio.SocketStream, keys: _ChannelKeys, side: int, config: ChannelConfig) -> SecureChannelStream:
    tune_socket(sock, config.socket_buffer)
    key = channel_key(keys.secret, keys.dialer, keys.listener)
    other = LISTENER if side == DIALER else DIALER
    remote = keys.listener if side == DIALER else keys.dialer
    sealer, opener = RecordSealer(key, side, keys.aead), RecordOpener(key, other, keys.aead)
    return SecureChannelStream(sock, sealer, opener, remote, config.timeouts)


async def serve_data_channels(
    host: ChannelHost, callback: ChannelCallback, config: ChannelConfig = ChannelConfig(), *,
    task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Accept data channels on `host` until cancelled; `callback(peer_id, stream)` runs once per channel.

    `peer_id` is the libp2p-authenticated peer; the stream is closed when the callback returns, and an exception
    from the callback is logged and ends that channel only.

    Start it in a nursery: `port = await nursery.start(serve_data_channels, host, callback)`.
    """
    await DataChannelServer(host, callback, config).run(task_status=task_status)


# --------------------------------------------------------------------------------------------- dialer side


TICKETS = TicketBook()
"""Tickets this process holds for channels it may open (p2p.channel.tickets), per (our peer, their peer)."""
_TICKETS_PER_PAIR = 2 * MAX_TICKETS


async def open_data_channel(host: ChannelHost, peer_id: str, config: ChannelConfig = ChannelConfig()) -> DataChannel:
    """A byte stream to `peer_id`: the fast data socket (with a ticket when one is held, else after a handshake), or
    the libp2p stream when the socket is unreachable."""
    try_socket = config.use_socket and socket_reachable(host, peer_id)
    if config.use_socket and not try_socket and not config.allow_fallback:
        raise ChannelError(f"data socket of {peer_id} is unreachable (relayed, hole-punched or failed lately)")
    if try_socket:
        channel = await _open_with_ticket(host, peer_id, config)
        if channel is not None:
            return channel
        try:
            return await _open_socket_channel(host, peer_id, config)
        except _SocketUnreachable as exc:
            note_socket_unreachable(host, peer_id)
            if not config.allow_fallback:
                raise ChannelError(f"data socket of {peer_id} is unreachable: {exc}") from exc
            if peer_id not in _fallback_logged:
                _fallback_logged.add(peer_id)
                log.warning("data socket of %s unreachable (%s); using the slower libp2p stream", peer_id, exc)
    return await _open_stream_channel(host, peer_id, config)


class _SocketUnreachable(Exception):
    """Internal: the offer arrived but the data socket could not be used, so the libp2p stream is tried."""


async def _open_with_ticket(host: ChannelHost, peer_id: str, config: ChannelConfig) -> SecureChannelStream | None:
    """A channel opened with a ticket held for `peer_id`; None when none is held or the listener refused it. A
    refusal drops that peer's other tickets too (it restarted, or dropped them under its caps) and is not taken for
    an unreachable socket: the caller opens the channel with a handshake instead."""
    ticket = TICKETS.take(host.peer_id, peer_id, trio.current_time())
    if ticket is None:
        return None
    try:
        return await _connect_with_token(ticket.ip, ticket.port, ticket.token,
                                         _ChannelKeys(ticket.secret, ticket.aead, host.peer_id, peer_id), config)
    except _SocketUnreachable as exc:
        TICKETS.forget(host.peer_id, peer_id)
        log.debug("ticket for a data channel to %s refused (%s); opening it with a handshake", peer_id, exc)
        return None


async def _request_offer(host: ChannelHost, peer_id: str, config: ChannelConfig) -> tuple[str, ChannelOffer]:
    """The listener's offer over a new libp2p stream, and the IP its data socket is reached at."""
    stream = await host.new_stream(peer_id, PROTOCOL)
    request = ChannelRequest("socket", tuple(sorted(AEADS)), config.tickets_per_offer)
    try:
        with trio.fail_after(config.handshake_timeout):
            await write_msg(stream, encode_request(request))
            offer = decode_offer(await read_msg(stream))
    except trio.TooSlowError as exc:
        raise ChannelError(f"data channel handshake with {peer_id} timed out") from exc
    finally:
        await close_quietly(stream)
    if offer.aead not in AEADS:  # we listed what we support: another cipher is a breach, not a fallback
        raise HandshakeBreach(f"data channel offer of {peer_id} names a cipher we did not list")
    if len(offer.tickets) > request.tickets:
        raise HandshakeBreach(f"data channel offer of {peer_id} carries more tickets than we asked for")
    remote = stream.get_remote_address()
    if not remote:
        raise _SocketUnreachable("the libp2p connection has no IP address to reach")
    return remote[0], offer


async def _open_socket_channel(host: ChannelHost, peer_id: str, config: ChannelConfig) -> SecureChannelStream:
    ip, offer = await _request_offer(host, peer_id, config)
    expires = trio.current_time() + offer.ticket_s  # from the offer's arrival: a little after the listener's count
    keys = _ChannelKeys(offer.secret, offer.aead, host.peer_id, peer_id)
    channel = await _connect_with_token(ip, offer.port, offer.token, keys, config)
    TICKETS.add(host.peer_id, peer_id, [Ticket(ip, offer.port, t, ticket_secret(offer.secret, t), offer.aead, expires)
                                        for t in offer.tickets], _TICKETS_PER_PAIR)
    return channel


async def _connect_with_token(ip: str, port: int, token: bytes, keys: _ChannelKeys,
                              config: ChannelConfig) -> SecureChannelStream:
    """Connect to the listener's data socket, present `token` and wait for its accept record (sealed with the
    channel's key, so only the listener that issued the token can send it)."""
    try:
        with trio.fail_after(config.connect_timeout):
            sock = await trio.open_tcp_stream(ip, port)
    except (trio.TooSlowError, OSError) as exc:
        raise _SocketUnreachable(f"{ip}:{port}: {_why(exc)}") from exc
    channel = _make_stream(sock, keys, DIALER, config)
    try:
        with trio.fail_after(config.handshake_timeout):
            await sock.send_all(token)
            await channel.receive_accept()
    except (trio.TooSlowError, ChannelError, trio.BrokenResourceError, OSError) as exc:
        await channel.abort()
        raise _SocketUnreachable(f"{ip}:{port} did not accept the token ({_why(exc)})") from exc
    return channel


async def _open_stream_channel(host: ChannelHost, peer_id: str, config: ChannelConfig) -> Libp2pByteStream:
    tune_yamux()
    stream = await host.new_stream(peer_id, PROTOCOL)
    try:
        with trio.fail_after(config.handshake_timeout):
            await write_msg(stream, encode_request(ChannelRequest("stream", None)))
    except Exception as exc:  # noqa: BLE001 - a timeout or a reset: one sentence for the caller
        await close_quietly(stream)
        raise ChannelError(f"data stream to {peer_id} failed to open ({type(exc).__name__})") from exc
    return Libp2pByteStream(stream, peer_id)
