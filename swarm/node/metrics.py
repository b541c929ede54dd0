"""A peer's Prometheus endpoint (`--metrics-port`): pieces, gossip, votes, the trainer's gate and step figures,
generation, versions; docs/grafana/swarm.json is a dashboard of them.

Why a registry per node and a collector that reads the node when scraped: `swarm sim` runs many nodes in one
process, and prometheus_client's default registry (which py-libp2p's own metrics classes fill) would mix them. What
the node already counts (gossip's stats, each piece service's per-peer stats, py-libp2p's connection counts) is
read at scrape time, never copied; what only its events tell (votes, gate outcomes, generated rollouts) is summed
from them as they are emitted. The HTTP side is a small trio server in the node's nursery, so a scrape reads the
node on the node's own thread; a scraper is a network peer like any other: its request head is bounded in size and
time, connections are capped, and whatever it sends costs that connection only.
"""

from __future__ import annotations

import functools
import importlib.metadata
import logging
import math
import socket
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

import trio
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, InfoMetricFamily

from swarm.errors import UserError
from swarm.event_types import Gate, Generated, MetricsListening, TrainStep, Validated
from swarm.events import Emitted
from swarm.node.state import Node

log = logging.getLogger(__name__)

MAX_REQUEST_BYTES = 8192
"""Longest request head a scraper may send (Prometheus sends a few hundred bytes)."""
REQUEST_TIMEOUT_S = 5.0
"""Time a scraper has to send its request head and take the answer."""
MAX_SCRAPES = 8
"""Connections served at once; more are closed at once (a scraper retries, a flood costs nothing)."""
PIECE_STATS = ("pieces_down", "pieces_up", "pieces_corrupt", "bytes_down", "bytes_up")


@dataclass
class PieceTotals:
    """Piece-protocol totals over every version a node mirrored, those it dropped included: a counter never falls.

    Why references to each live service's stats: a version is garbage-collected with its service, and what it
    moved since the last scrape would be lost; the stats object is kept (not the service) and folded into
    `retired` once its version is gone."""

    live: dict[bytes, dict] = field(default_factory=dict)  # manifest id -> its service's per-peer stats
    retired: Counter = field(default_factory=Counter)

    def observe(self, policies: dict) -> None:
        """Note the services of `policies` (the mirror's, by manifest id); retire those no longer there."""
        for mid, policy in policies.items():
            if policy.service is not None:
                self.live[mid] = policy.service.stats
        for mid in [mid for mid in self.live if mid not in policies]:
            self.retired.update(_summed(self.live.pop(mid)))

    def totals(self) -> Counter:
        totals = Counter(self.retired)
        for stats in self.live.values():
            totals.update(_summed(stats))
        return totals


def _summed(stats: dict) -> Counter:
    return Counter({name: sum(getattr(s, name) for s in stats.values()) for name in PIECE_STATS})


@dataclass
class RoleCounters:
    """What a node's roles report only through events, summed as they come (swarm.events)."""

    votes_cast: int = 0
    rollouts: int = 0
    groups: int = 0
    tokens: int = 0
    gate: dict[str, int] = field(default_factory=dict)  # the trainer's gate counts (cumulative: "gate", "train_step")
    trainer_step: int = -1
    trainer_figures: dict[str, float] = field(default_factory=dict)  # the last step's, by train_step field

    def on_event(self, emitted: Emitted) -> None:
        event = emitted.event
        if isinstance(event, Validated):  # cumulative: one vote per checked rollout
            self.votes_cast = max(self.votes_cast, _count(event.checked))
        elif isinstance(event, Generated):
            self.groups += _count(event.groups)
            self.rollouts += _count(event.completions)
            self.tokens += _count(event.tokens)
        elif isinstance(event, Gate) and isinstance(event.counts, dict):
            self.gate = _gate_counts(event.counts)
        elif isinstance(event, TrainStep):
            self.trainer_step = max(self.trainer_step, _count(event.step))
            figures = {key: getattr(event, key) for key, _, _ in TRAINER_GAUGES}
            self.trainer_figures.update({key: float(value) for key, value in figures.items() if _is_number(value)})
            if isinstance(event.gate, dict):  # the counts the step trained from: a "gate" event comes only
                self.gate = _gate_counts(event.gate)  # at the gate's next tick


TRAINER_GAUGES = (
    ("reward", "rlswarm_trainer_reward", "Trainer role: mean reward of the last step's quorum-accepted groups"),
    ("loss", "rlswarm_trainer_loss", "Trainer role: the last step's GRPO loss"),
    ("kl", "rlswarm_trainer_kl", "Trainer role: the last step's KL to the initial policy (token mean)"),
    ("entropy", "rlswarm_trainer_entropy", "Trainer role: the last step's policy entropy (token mean)"),
    ("lr", "rlswarm_trainer_learning_rate", "Trainer role: the learning rate of the last step"),
    ("step_seconds", "rlswarm_trainer_step_seconds", "Trainer role: seconds the last optimizer step took"),
)
"""(train_step field, metric, help) of the trainer's per-step figures; each is served once a step has reported it."""


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _gate_counts(counts: dict) -> dict[str, int]:
    return {str(k): _count(v) for k, v in counts.items()}


def _count(value: object) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0


class NodeCollector:
    """The prometheus_client collector of one node (registered in that node's own registry)."""

    def __init__(self, node: Node, pieces: PieceTotals, roles: RoleCounters) -> None:
        self.node, self.pieces, self.roles = node, pieces, roles

    def collect(self):
        yield from self._pieces()
        yield from self._gossip()
        yield from self._votes_and_gate()
        yield from self._generation()
        yield from self._trainer()
        yield from self._peer()

    def _pieces(self):
        self.pieces.observe(self.node.mirror.policies)
        totals = self.pieces.totals()
        pieces = CounterMetricFamily("rlswarm_pieces", "Policy pieces moved by the piece protocol",
                                     labels=["direction"])
        pieces.add_metric(["received"], totals["pieces_down"])
        pieces.add_metric(["served"], totals["pieces_up"])
        yield pieces
        yield _counter("rlswarm_pieces_verified", "Received pieces whose BLAKE3 matched the manifest",
                       totals["pieces_down"] - totals["pieces_corrupt"])
        yield _counter("rlswarm_pieces_failed", "Received pieces whose BLAKE3 did not match (their sender is banned)",
                       totals["pieces_corrupt"])
        moved = CounterMetricFamily("rlswarm_piece_bytes", "Piece bytes moved", labels=["direction"])
        moved.add_metric(["received"], totals["bytes_down"])
        moved.add_metric(["served"], totals["bytes_up"])
        yield moved

    def _gossip(self):
        stats = self.node.gossip.stats
        yield _counter("rlswarm_gossip_delivered", "Verified gossip messages handed to this peer's roles",
                       stats.delivered)
        yield _counter("rlswarm_gossip_published", "Gossip messages this peer published", stats.published)
        refused = CounterMetricFamily("rlswarm_gossip_refused", "Gossip messages refused, by reason",
                                      labels=["reason"])
        for reason, n in sorted(stats.rejected.items()):
            refused.add_metric([str(reason)], n)
        yield refused
        moved = CounterMetricFamily("rlswarm_gossip_bytes", "Gossip envelope bytes", labels=["direction"])
        moved.add_metric(["delivered"], stats.bytes_delivered)
        moved.add_metric(["published"], stats.bytes_published)
        yield moved
        yield _counter("rlswarm_gossip_dropped_slow_consumer", "Verified messages a full subscriber queue lost",
                       stats.dropped_slow_consumer)
        yield _counter("rlswarm_gossip_bans", "Peers banned for their gossip", stats.bans)

    def _votes_and_gate(self):
        yield _counter("rlswarm_votes_cast", "Votes this validator cast (one per checked rollout)",
                       self.roles.votes_cast)
        received = CounterMetricFamily("rlswarm_votes_received", "Votes the trainer's gate received, by status",
                                       labels=["status"])
        gate = CounterMetricFamily("rlswarm_gate_groups", "Rollout groups the trainer's gate settled or refused",
                                   labels=["outcome", "reason"])
        for what, n in sorted(self.roles.gate.items()):
            head, _, tail = what.partition(":")
            if head == "vote":
                received.add_metric([tail], n)
            elif head == "refused":
                gate.add_metric(["refused", tail], n)
            else:
                gate.add_metric([head, ""], n)
        yield received
        yield gate

    def _generation(self):
        yield _counter("rlswarm_generated_groups", "Rollout groups this inference peer generated", self.roles.groups)
        yield _counter("rlswarm_generated_rollouts", "Completions this inference peer generated", self.roles.rollouts)
        yield _counter("rlswarm_generated_tokens", "Completion tokens this inference peer generated",
                       self.roles.tokens)

    def _trainer(self):
        figures = self.roles.trainer_figures
        for key, name, documentation in TRAINER_GAUGES:
            if key in figures:
                yield GaugeMetricFamily(name, documentation, value=figures[key])

    def _peer(self):
        node = self.node
        info = InfoMetricFamily("rlswarm_peer", "This peer: its id, run, roles and software version")
        info.add_metric([], {"peer_id": str(node.peer_id), "run": node.config.peer.run,
                             "roles": ",".join(node.config.peer.roles), "version": software_version()})
        yield info
        newest = node.mirror.latest()
        yield GaugeMetricFamily("rlswarm_policy_version", "Newest complete policy version this peer holds (-1: none)",
                                value=newest.manifest.version if newest is not None else -1)
        yield GaugeMetricFamily("rlswarm_trainer_step", "Trainer role: the last step trained (-1: none)",
                                value=self.roles.trainer_step)
        yield GaugeMetricFamily("rlswarm_peers_known", "Peers heard from by heartbeat", value=len(node.peer_roles))
        connections = GaugeMetricFamily("rlswarm_connections", "Open libp2p connections (py-libp2p's own counts)",
                                        labels=["direction"])
        for direction, n in _connection_counts(node).items():
            connections.add_metric([direction], n)
        yield connections
        refused = CounterMetricFamily("rlswarm_inbound_refused", "Inbound connections refused by the node-wide "
                                      "rates of handshakes and of new peers (p2p.host.inbound_admission)",
                                      labels=["reason"])
        for reason, n in getattr(getattr(node.host, "inbound", None), "refused", {}).items():
            refused.add_metric([reason], n)
        yield refused


def _counter(name: str, documentation: str, value: int) -> CounterMetricFamily:
    return CounterMetricFamily(name, documentation, value=value)


def _connection_counts(node: Node) -> dict[str, int]:
    """The host's open connections by direction (py-libp2p's own counts); nothing when it cannot say."""
    try:
        return node.host.connection_counts()
    except Exception as exc:  # noqa: BLE001 - a scrape shows what it can; this gauge is optional
        log.debug("no connection counts: %s", exc)
        return {}


@functools.cache
def software_version() -> str:
    """The installed rl-swarm distribution's version (read once: the metadata lookup walks sys.path)."""
    try:
        return importlib.metadata.version("rl-swarm")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def node_registry(node: Node) -> CollectorRegistry:
    """A registry of `node`'s metrics alone; its event-fed counters listen to the node's events from now on."""
    pieces, roles = PieceTotals(), RoleCounters()

    def on_event(emitted: Emitted) -> None:
        roles.on_event(emitted)
        pieces.observe(node.mirror.policies)  # every event: a version dropped between scrapes keeps its counts

    node.events.listeners.append(on_event)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(NodeCollector(node, pieces, roles))
    return registry


def answer(head: bytes, render: Callable[[], bytes]) -> tuple[str, bytes, str]:
    """(status, body, content type) for a request head: GET /metrics (or /) renders; anything else is refused."""
    line = head.split(b"\r\n", 1)[0].decode("latin-1")
    parts = line.split(" ")
    if len(parts) != 3 or not parts[2].startswith("HTTP/"):
        return "400 Bad Request", b"bad request\n", "text/plain"
    method, target, _ = parts
    if method not in ("GET", "HEAD"):
        return "405 Method Not Allowed", b"only GET\n", "text/plain"
    if target.split("?", 1)[0] not in ("/metrics", "/"):
        return "404 Not Found", b"try /metrics\n", "text/plain"
    body = render()
    return "200 OK", (b"" if method == "HEAD" else body), CONTENT_TYPE_LATEST


async def read_head(stream: trio.abc.ReceiveStream, limit: int = MAX_REQUEST_BYTES) -> bytes | None:
    """The request head (through its blank line), or None when the scraper closes first or sends more than
    `limit` bytes without ending it."""
    buffer = bytearray()
    while b"\r\n\r\n" not in buffer:
        if len(buffer) > limit:
            return None
        chunk = await stream.receive_some(4096)
        if not chunk:
            return None
        buffer += chunk
    return bytes(buffer)


async def handle_scrape(render: Callable[[], bytes], limiter: trio.CapacityLimiter, stream: trio.abc.Stream) -> None:
    """One connection: read the head, answer, close. A broken or slow scraper ends its connection only."""
    try:
        limiter.acquire_nowait()
    except trio.WouldBlock:
        await trio.aclose_forcefully(stream)
        return
    try:
        with trio.move_on_after(REQUEST_TIMEOUT_S):
            head = await read_head(stream)
            if head is not None:
                status, body, content_type = answer(head, render)
                await stream.send_all(f"HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: "
                                      f"{len(body)}\r\nConnection: close\r\n\r\n".encode() + body)
    except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
        log.debug("metrics scrape ended early: %s", exc)
    finally:
        limiter.release()
        await trio.aclose_forcefully(stream)


def check_port_free(host: str, port: int) -> None:
    """Refuse a metrics port that is taken before the peer writes anything (the server binds it again later)."""
    if not port:
        return
    try:
        with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as probe:
            probe.bind((host, port))
    except OSError as exc:
        raise UserError(f"cannot serve metrics on {host}:{port}: {exc.strerror or exc}") from None


async def serve_node_metrics(node: Node, *, task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED) -> None:
    """Serve `node`'s metrics on its config's metrics_host:metrics_port until cancelled; started() gets the port."""
    host, port = node.config.peer.metrics_host, node.config.peer.metrics_port
    try:
        listeners = await trio.open_tcp_listeners(port, host=host)
    except OSError as exc:
        raise UserError(f"cannot serve metrics on {host}:{port}: {exc.strerror or exc}") from None
    registry = node_registry(node)
    node.events.emit(MetricsListening(url=f"http://{host}:{port}/metrics",
                                      message=f"Prometheus metrics at http://{host}:{port}/metrics"))
    task_status.started(port)
    render = functools.partial(generate_latest, registry)
    handler = functools.partial(handle_scrape, render, trio.CapacityLimiter(MAX_SCRAPES))
    await trio.serve_listeners(handler, listeners)
