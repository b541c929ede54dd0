"""The data channel's settings: timeouts, the caps that bound what strangers can hold, the cipher and tickets."""

from __future__ import annotations

from dataclasses import dataclass, field

from p2p.channel.messages import MAX_TICKET_S, MAX_TICKETS
from p2p.channel.records import AEADS
from p2p.channel.stream import StreamTimeouts
from p2p.errors import ChannelError


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
    tickets_per_offer: int = 3
    """Tickets a dialer asks for with each offer, and a listener grants at most (p2p.channel.tickets), 0 to
    MAX_TICKETS; 0 asks for, or grants, none."""
    max_tickets_per_peer: int = 8
    """Unused tickets one peer may hold; new ones replace its oldest (never refused: see _grant_tickets)."""
    max_tickets: int = 1024
    """Unused tickets kept over all peers (identities are free); past it the oldest goes, and its holder opens its
    next channel with a handshake."""
    ticket_ttl: float = 720.0
    """Seconds a listener's tickets stay valid: past a spare channel's life (swarm.policy's spare_ttl, 600 s), so
    the ticket of a spare's replacement is still good when it is dialed."""
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
    nothing); past it handshakes are refused, and so are sockets presenting a token. As many unclaimed offers are
    kept, past that the oldest goes."""
    handshakes_per_s: float = 8.0
    handshake_burst: int = 64
    """New data channel handshakes (and channels opened with tickets) accepted per second, over all peers, with
    bursts of `handshake_burst`; past it a handshake is closed before a byte of it is read, and a ticket's socket
    is dropped. Identities are free: a stranger reopens at once each channel refused for a spent budget, and each
    costs a stream, a negotiation and a read of what it carries."""
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
                or self.handshakes_per_s <= 0 or self.handshake_burst < 1 or self.max_tickets < 1
                or self.max_tickets_per_peer < 1 or not 1 <= self.ticket_ttl <= MAX_TICKET_S):
            raise ChannelError("data channel limits must be positive (socket_buffer may be 0)")
        if not 0 <= self.tickets_per_offer <= MAX_TICKETS:
            raise ChannelError(f"tickets_per_offer must be 0 to {MAX_TICKETS}, got {self.tickets_per_offer}")
        if self.aead is not None and self.aead not in AEADS:
            raise ChannelError(f"unknown data channel cipher {self.aead!r}; choose one of {', '.join(sorted(AEADS))}")
