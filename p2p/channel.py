"""The fast data channel: libp2p authenticates and hands over a one-time key and token, bytes move on a TCP socket.

Why: a py-libp2p Noise+Yamux stream moves about 0.25x of raw TCP; a plain trio socket carrying AEAD records of up
to 1 MiB (a piece payload each) moves about 0.5x here, the AEAD being most of the rest (channel_records.py).
Security rests on the libp2p stream: the offer (port, token, secret) travels inside Noise to the authenticated
peer only, the token admits exactly one socket once, and the record key is derived from the secret AND both peer
ids, so a channel is bound to the two peers libp2p authenticated. When the data socket cannot be reached (relays,
NAT), the same libp2p protocol carries the bytes itself (`Libp2pByteStream`), slower but always there; that
fallback is logged once per peer.

Handshake on PROTOCOL (u16 length + one message of p2p/channel_messages.py each way): the dialer's request (socket
or stream), the listener's offer (port, token, secret, cipher). The dialer connects to the listener's IP (the one
its libp2p connection reached) and port and sends the token; the listener answers with one empty record
("accepted") or drops the socket at once. In stream mode the libp2p stream itself becomes the data channel.
"""

from __future__ import annotations

import logging
import os
import struct
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import blake3
import trio

from p2p.channel_addresses import is_loopback, listen_ip, note_socket_unreachable, remote_ip, socket_reachable
from p2p.channel_messages import (
    MAX_MESSAGE, TOKEN_BYTES, ChannelOffer, ChannelRequest, HandshakeBreach, decode_offer, decode_request,
    encode_offer, encode_request,
)
from p2p.channel_records import (
    AEADS, DIALER, KEY_BYTES, LISTENER, RecordOpener, RecordSealer, choose_aead, preferred_aead,
)
from p2p.channel_stream import SecureChannelStream, StreamTimeouts, tune_socket
from p2p.errors import ChannelError
from p2p.libp2p_compat import Libp2pByteStream, tune_yamux
from p2p.ratelimit import Allowance

log = logging.getLogger(__name__)

PROTOCOL = "/rl-swarm/data/1.0.0"
_MSG_LEN = struct.Struct(">H")
_KEY_CONTEXT = "rl-swarm 2026 data channel v1 record key"
ChannelCallback = Callable[[str, Any], Awaitable[None]]
_fallback_logged: set[str] = set()


@dataclass(frozen=True)
class ChannelConfig:
    """Limits and choices of data channels, in seconds of trio time."""

    handshake_timeout: float = 10.0
    """Offer exchange over libp2p plus the token check on the data socket."""
    connect_timeout: float = 5.0
    """TCP connect to the peer's data socket; past it the channel falls back to the libp2p stream."""
    token_ttl: float = 15.0
    """An unused offer expires after this (a token is also single-use)."""
    use_socket: bool = True
    """False forces the libp2p-stream transport (e.g. behind a relay)."""
    allow_fallback: bool = True
    """False makes an unreachable data socket an error instead of a fallback."""
    socket_buffer: int = 0
    """SO_SNDBUF / SO_RCVBUF of data sockets; 0 keeps the kernel's autotuning (which a fixed size turns off)."""
    max_offers_per_peer: int = 16
    """Outstanding (unclaimed) offers one peer may hold; more handshakes from it are refused."""
    max_pending_sockets: int = 64
    """Data sockets still presenting their token; further connections are dropped at once (flood guard)."""
    max_pending_per_ip: int = 8
    """The same, per remote IP (127.0.0.0/8 and ::1 included unless `exempt_loopback`): one stranger's silent
    sockets would otherwise fill every place, and every honest peer would fall back to the slow stream path."""
    exempt_loopback: bool = False
    """True lifts the per-IP cap for loopback addresses: only for a simulation or benchmark that runs every peer
    on 127.0.0.1 (`swarm sim`), never for a peer other local users can reach."""
    max_channels: int = 256
    """Data channels open at once on this node, over all peers (identities are free: a per-peer limit bounds
    nothing); past it handshakes are refused. As many unclaimed offers are kept, past that the oldest goes."""
    handshakes_per_s: float = 8.0
    handshake_burst: int = 64
    """New data channel handshakes accepted per second, over all peers, with bursts of `handshake_burst`; past it a
    handshake is closed before a byte of it is read. Identities are free: a stranger reopens at once each channel
    refused for a spent budget, and each costs a stream, a negotiation and a read of what it carries."""
    token_timeout: float = 3.0
    """A dialer writes its token as soon as it connects; a socket silent this long is dropped."""
    aead: str | None = None
    """Cipher this listener prefers (a name in channel_records.AEADS); None picks by CPU (preferred_aead). It is
    offered when the dialer supports it, else AES-256-GCM or ChaCha20-Poly1305 (choose_aead)."""
    timeouts: StreamTimeouts = field(default_factory=StreamTimeouts)

    def __post_init__(self) -> None:
        for name in ("handshake_timeout", "connect_timeout", "token_ttl"):
            if not getattr(self, name) > 0:
                raise ChannelError(f"data channel {name} must be positive, got {getattr(self, name)}")
        if (self.max_offers_per_peer < 1 or self.max_pending_sockets < 1 or self.max_pending_per_ip < 1
                or self.max_channels < 1 or self.token_timeout <= 0 or self.socket_buffer < 0
                or self.handshakes_per_s <= 0 or self.handshake_burst < 1):
            raise ChannelError("data channel limits must be positive (socket_buffer may be 0)")
        if self.aead is not None and self.aead not in AEADS:
            raise ChannelError(f"unknown data channel cipher {self.aead!r}; choose one of {', '.join(sorted(AEADS))}")


def channel_key(secret: bytes, dialer: str, listener: str) -> bytes:
    """The record key: bound to the one-time secret and to both authenticated peer ids."""
    material = b"".join(_MSG_LEN.pack(len(p)) + p for p in (secret, dialer.encode(), listener.encode()))
    return blake3.blake3(material, derive_key_context=_KEY_CONTEXT).digest(length=KEY_BYTES)


# ------------------------------------------------------------------------------------- handshake messages


class HandshakeAbandoned(ChannelError):
    """The peer closed the handshake before sending a byte, or reset it before our answer: it gave up (done, shutting
    down, dial cancelled). Nothing hostile: logged at debug level, where a malformed handshake is a warning."""


async def _write_msg(stream: Any, raw: bytes) -> None:
    """Send one encoded handshake message; a stream the peer reset or closed is HandshakeAbandoned."""
    try:
        await stream.write(_MSG_LEN.pack(len(raw)) + raw)
    except (trio.Cancelled, trio.TooSlowError):
        raise
    except Exception as exc:  # noqa: BLE001 - py-libp2p raises StreamReset/StreamClosed/etc. on a dying stream
        raise HandshakeAbandoned(f"data channel handshake stream gone while sending ({type(exc).__name__})") from exc


async def _read_exact_libp2p(stream: Any, n: int, *, opening: bool = False) -> bytes:
    """Exactly n bytes; `opening`: the first read of a handshake, where an immediate end is HandshakeAbandoned."""
    buf = bytearray()
    while len(buf) < n:
        try:
            chunk = await stream.read(n - len(buf))
        except EOFError:  # py-libp2p's StreamEOF
            chunk = b""
        if not chunk:
            if opening and not buf:
                raise HandshakeAbandoned("the peer closed the handshake stream before sending anything")
            raise ChannelError("handshake stream ended early")
        buf += chunk
    return bytes(buf)


async def _read_msg(stream: Any, *, opening: bool = False) -> bytes:
    """One handshake message's bytes, its length checked before they are read (the decoders check the rest)."""
    try:
        (size,) = _MSG_LEN.unpack(await _read_exact_libp2p(stream, _MSG_LEN.size, opening=opening))
        if size > MAX_MESSAGE:
            raise HandshakeBreach(f"handshake message of {size} bytes exceeds {MAX_MESSAGE}")
        return await _read_exact_libp2p(stream, size)
    except ChannelError:
        raise
    except Exception as exc:  # noqa: BLE001 - EOF, reset or garbage: all mean a failed handshake
        raise ChannelError(f"bad data channel handshake ({type(exc).__name__})") from exc


# ------------------------------------------------------------------------------------------- listener side


@dataclass
class _Offer:
    peer_id: str
    secret: bytes
    aead: str
    expires: float


class DataChannelServer:
    """Accepts data channels for one host: libp2p handshakes, the data socket listener, token admission."""

    def __init__(self, host: Any, callback: ChannelCallback, config: ChannelConfig = ChannelConfig()) -> None:
        self.host = host
        self.callback = callback
        self.config = config
        self.port = 0
        self._offers: dict[bytes, _Offer] = {}
        self.rejected = 0
        self.aead = config.aead or preferred_aead()
        self._pending_sockets, self._open_channels = 0, 0
        self._pending_by_ip: dict[str, int] = {}
        self.refused_channels = 0  # handshakes refused because max_channels were open
        self._handshakes = Allowance(config.handshakes_per_s, config.handshake_burst)
        self.refused_handshakes = 0  # handshakes refused because the node-wide handshake rate was spent

    @property
    def pending_sockets(self) -> int:
        """Data sockets connected but not yet admitted (their token not yet checked)."""
        return self._pending_sockets

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
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

    async def _handle_handshake(self, stream: Any) -> None:
        if not self._handshakes.take(1, trio.current_time()):
            self.refused_handshakes += 1  # counted, not logged: a line each would cost what the refusal saves
            await _close_quietly(stream)
            return
        peer_id = self.host.remote_peer_id(stream)
        with trio.fail_after(self.config.handshake_timeout):
            try:
                request = decode_request(await _read_msg(stream, opening=True))
            except HandshakeAbandoned:
                log.debug("peer %s closed a data channel handshake before sending it", peer_id)
                return
        self._expire_offers()
        if self._open_channels >= self.config.max_channels:
            self.refused_channels += 1
            log.debug("refused a data channel of %s: %d channels open", peer_id, self._open_channels)
            await _close_quietly(stream)  # the dialer reads an end at once, not a silence until its timeout
            return
        if request.mode == "stream":
            tune_yamux()
            await self._serve(peer_id, Libp2pByteStream(stream, peer_id))
            return
        await self._make_offer(stream, peer_id, request)

    async def _make_offer(self, stream: Any, peer_id: str, request: ChannelRequest) -> None:
        aead = choose_aead(self.aead, None if request.aeads is None else list(request.aeads))
        token, secret = os.urandom(TOKEN_BYTES), os.urandom(KEY_BYTES)
        if sum(o.peer_id == peer_id for o in self._offers.values()) >= self.config.max_offers_per_peer:
            raise ChannelError(f"peer {peer_id} holds too many unclaimed data channel offers")
        if len(self._offers) >= self.config.max_channels:  # strangers' unclaimed offers must not lock others out
            del self._offers[next(iter(self._offers))]
        self._offers[token] = _Offer(peer_id, secret, aead, trio.current_time() + self.config.token_ttl)
        offer = encode_offer(ChannelOffer(self.port, token, secret, aead))
        with trio.fail_after(self.config.handshake_timeout):
            try:
                await _write_msg(stream, offer)
            except HandshakeAbandoned:
                del self._offers[token]  # never delivered: nobody can claim it
                log.debug("peer %s reset a data channel handshake before our offer", peer_id)
                return
            await stream.close()

    def _expire_offers(self) -> None:
        for token in [t for t, o in self._offers.items() if o.expires < trio.current_time()]:
            del self._offers[token]

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
        offer = self._offers.pop(bytes(token), None)
        if offer is None or offer.expires < trio.current_time():
            return None
        return offer

    async def _serve(self, peer_id: str, channel: Any) -> None:
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
    host: Any, callback: ChannelCallback, config: ChannelConfig = ChannelConfig(), *,
    task_status=trio.TASK_STATUS_IGNORED,
) -> None:
    """Accept data channels on `host` until cancelled; `callback(peer_id, stream)` runs once per channel.

    `peer_id` is the libp2p-authenticated peer; the stream is closed when the callback returns, and an exception
    from the callback is logged and ends that channel only.

    Start it in a nursery: `port = await nursery.start(serve_data_channels, host, callback)`.
    """
    await DataChannelServer(host, callback, config).run(task_status=task_status)


# --------------------------------------------------------------------------------------------- dialer side


async def open_data_channel(host: Any, peer_id: str, config: ChannelConfig = ChannelConfig()) -> Any:
    """A byte stream to `peer_id`: the fast data socket, or the libp2p stream when the socket is unreachable."""
    try_socket = config.use_socket and socket_reachable(host, peer_id)
    if config.use_socket and not try_socket and not config.allow_fallback:
        raise ChannelError(f"data socket of {peer_id} is unreachable (relayed, hole-punched or failed lately)")
    if try_socket:
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


async def _request_offer(host: Any, peer_id: str, config: ChannelConfig) -> tuple[str, int, bytes, bytes, str]:
    stream = await host.new_stream(peer_id, PROTOCOL)
    try:
        with trio.fail_after(config.handshake_timeout):
            await _write_msg(stream, encode_request(ChannelRequest("socket", tuple(sorted(AEADS)))))
            offer = decode_offer(await _read_msg(stream))
    except trio.TooSlowError as exc:
        raise ChannelError(f"data channel handshake with {peer_id} timed out") from exc
    finally:
        await _close_quietly(stream)
    if offer.aead not in AEADS:  # we listed what we support: another cipher is a breach, not a fallback
        raise HandshakeBreach(f"data channel offer of {peer_id} names a cipher we did not list")
    remote = stream.get_remote_address()
    if not remote:
        raise _SocketUnreachable("the libp2p connection has no IP address to reach")
    return remote[0], offer.port, offer.token, offer.secret, offer.aead


async def _open_socket_channel(host: Any, peer_id: str, config: ChannelConfig) -> SecureChannelStream:
    ip, port, token, secret, aead = await _request_offer(host, peer_id, config)
    try:
        with trio.fail_after(config.connect_timeout):
            sock = await trio.open_tcp_stream(ip, port)
    except (trio.TooSlowError, OSError) as exc:
        raise _SocketUnreachable(f"{ip}:{port}: {_why(exc)}") from exc
    channel = _make_stream(sock, _ChannelKeys(secret, aead, host.peer_id, peer_id), DIALER, config)
    try:
        with trio.fail_after(config.handshake_timeout):
            await sock.send_all(token)
            await channel.receive_accept()
    except (trio.TooSlowError, ChannelError, trio.BrokenResourceError, OSError) as exc:
        await channel.abort()
        raise _SocketUnreachable(f"{ip}:{port} did not accept the token ({_why(exc)})") from exc
    return channel


async def _open_stream_channel(host: Any, peer_id: str, config: ChannelConfig) -> Libp2pByteStream:
    tune_yamux()
    stream = await host.new_stream(peer_id, PROTOCOL)
    try:
        with trio.fail_after(config.handshake_timeout):
            await _write_msg(stream, encode_request(ChannelRequest("stream", None)))
    except Exception as exc:  # noqa: BLE001 - a timeout or a reset: one sentence for the caller
        await _close_quietly(stream)
        raise ChannelError(f"data stream to {peer_id} failed to open ({type(exc).__name__})") from exc
    return Libp2pByteStream(stream, peer_id)


async def _close_quietly(stream: Any) -> None:
    with trio.move_on_after(1.0):
        try:
            await stream.close()
        except Exception:  # noqa: BLE001 - the offer already arrived; a close failure changes nothing
            log.debug("closing the handshake stream failed", exc_info=True)
