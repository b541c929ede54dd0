"""The peer's typed configuration: one section per role, loadable from TOML, overridable from the command line.

Why one config for all roles: a process may hold several roles (the local simulation runs many), and what they share
(run, data directory, network, base model) must agree; each role's own settings live in its own section. A TOML
file holds [peer], [mirror], [limits], [trainer] and [inference] tables; a file of one flat [peer] table (or of
top-level keys) loads too, each key taken to the one section that has it. `--set SECTION.FIELD=VALUE` sets any
field; `swarm config show --role peer` prints them all, each with its description and default.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, model_validator

from p2p.bootstrap import parse_bootstrap_lines
from p2p.errors import BootstrapError, HostError
from p2p.host.inbound_admission import InboundLimits
from p2p.reach.probe import ReachConfig
from p2p.reach.relay_limits import RelayLimits
from swarm.errors import UserError
from swarm.policy.runspec import PRECISIONS
from swarm.policy.trust import parse_public_key
from trainer.config import TrainerConfig
from trainer.errors import TrainerError
from trainer.tracking import parse_report_to
from trainer.typed_config import (
    ConfigPath,
    ConfigSection,
    Sections,
    Setting,
    StrTuple,
    build_sections,
    check_key,
    parse_assignment,
    read_toml,
    render_section,
)

ROLES = ("trainer", "inference", "validator", "seed")
_RUN_NAME = re.compile(r"[A-Za-z0-9._-]{1,64}")
"""Run names become parts of gossip topics, DHT keys and directory names."""
BACKENDS = ("torch", "vllm")  # inference.select.open_backend's names (kept here: a seed-only peer never imports torch)
DEVICES = ("auto", "cpu", "cuda")  # inference.select.resolve_device's names


class PeerSection(ConfigSection):
    """[peer] What every role shares: who this peer is, which run it joins, how it finds and hears the others."""

    roles: StrTuple = Field(("seed",), description=(
        "Roles this process plays: any of trainer, inference, validator, seed."))
    run: str = Field("default", description="The run's name; envelopes and DHT records of other runs are dropped.")
    trainer_key: str = Field("", description=(
        "Hex Ed25519 public key of the run's trainer (or a path to a key file); only manifests it signed are "
        "loaded. Empty: trust the first manifest signer seen on the run topic (test networks only; printed as a "
        "warning)."))
    data_dir: ConfigPath = Field(Path("./swarm-data"), description=(
        "Where the identity key, the piece store and the lock file live. One process per data directory."))
    listen: StrTuple = Field(("/ip4/127.0.0.1/tcp/0",), description=(
        "Multiaddrs to listen on; tcp/0 picks a free port."))
    bootstrap: StrTuple = Field((), description="Bootstrap multiaddrs; when empty, bootstrap_peers.txt is read.")
    bootstrap_file: ConfigPath = Field(Path("bootstrap_peers.txt"), description=(
        "File of bootstrap multiaddrs, one per line, '#' comments."))
    announce: StrTuple = Field((), description=(
        "Multiaddrs to give other peers instead of the listen addresses (e.g. the public address of a NAT port "
        "forward); empty: the listen addresses, /ip4/0.0.0.0 expanded to this machine's interface addresses."))
    model: str = Field("tiny", description=(
        "Base model of the trainer, inference and validator roles: tiny, smollm2, a local HF directory or a Hugging "
        "Face hub id in the local Hugging Face cache (HF_HUB_CACHE)."))
    device: str = Field("auto", description=(
        "Where the validator role prefills and the trainer role trains: auto (a CUDA GPU when torch sees one, "
        "else the CPU), cpu or cuda."))
    status_every_s: float = Field(2.0, description="Seconds between progress lines.")
    heartbeat_every_s: float = Field(6.0, description=(
        "Seconds between heartbeats (roles, addresses, policies held). Why not every status line: a heartbeat "
        "floods the whole run, and in the default simulation heartbeats every 3 s were 61 % of all gossip "
        "deliveries; every 6 s a peer still gets five chances within `peer_silence_s`."))
    bootstrap_redial_s: float = Field(10.0, description=(
        "Seconds between redials of bootstrap peers this peer is not connected to (one that restarted, or was not"
        " up yet when this peer started)."))
    bootstrap_timeout_s: float = Field(300.0, description=(
        "Seconds a peer that reaches none of its bootstrap peers keeps retrying (with backoff, one line per try) "
        "before it exits with status 1; 0: retry for ever."))
    wrong_key_timeout_s: float = Field(300.0, description=(
        "Seconds a peer that has seen policy manifests signed only by keys other than the run's trainer key waits "
        "for one the right key signed before it exits with status 1 (a wrong --trainer-key); 0: wait for ever."))
    metrics_port: int = Field(0, description=(
        "TCP port of this peer's Prometheus endpoint (swarm.node.metrics: GET /metrics); 0: no endpoint."))
    metrics_host: str = Field("127.0.0.1", description=(
        "Address the Prometheus endpoint listens on; 0.0.0.0 lets a Prometheus server on another machine scrape it."))
    peer_silence_s: float = Field(30.0, description=(
        "A peer not heard from (no heartbeat) this long is forgotten: its roles no longer count, so a trainer "
        "stops naming a validator that left in the versions it publishes."))

    @model_validator(mode="after")
    def _check_ranges(self) -> "PeerSection":
        unknown = [r for r in self.roles if r not in ROLES]
        if unknown or not self.roles:
            raise UserError(f"unknown role {unknown[0] if unknown else '(none)'}: choose from {', '.join(ROLES)}")
        if self.device not in DEVICES:
            raise UserError(f"unknown device {self.device!r}: choose from {', '.join(DEVICES)}")
        if self.bootstrap_redial_s <= 0:
            raise UserError("bootstrap_redial_s must be positive")
        for name in ("bootstrap_timeout_s", "wrong_key_timeout_s"):
            if not getattr(self, name) >= 0:
                raise UserError(f"{name} must be 0 (never) or a positive number of seconds")
        if self.heartbeat_every_s <= 0:
            raise UserError("heartbeat_every_s must be positive")
        if not 0 <= self.metrics_port <= 65535:
            raise UserError(f"metrics_port {self.metrics_port} is outside 0..65535 (0: no metrics endpoint)")
        if self.peer_silence_s < 3 * self.heartbeat_every_s:
            raise UserError(f"peer_silence_s {self.peer_silence_s:g} must be at least 3 heartbeats "
                            f"({3 * self.heartbeat_every_s:g} s)")
        if not _RUN_NAME.fullmatch(self.run):
            raise UserError(f"run name {self.run!r} must be 1 to 64 letters, digits, '.', '_' or '-'")
        return self


DHT_PROVIDERS_WANTED = 20.0
"""About how many peers of a large run announce each version on the DHT (swarm.node.node.provides_key)."""


class MirrorSection(ConfigSection):
    """[mirror] The policy copies every role keeps and serves (the seed role is this alone)."""

    keep_versions: int = Field(3, description=(
        "Policy versions kept in the store (the async window plus one); older ones are garbage-collected."))
    piece_kb: int = Field(1024, description="Piece size for policies this peer publishes, in KiB.")
    reseed: bool = Field(True, description=(
        "Serve pieces to others as soon as they verify (off only for the single-origin baseline)."))
    exit_when_complete: bool = Field(False, description=(
        "Exit once the newest policy is complete (benchmarks); normally peers seed until stopped."))
    links_per_version: int = Field(8, description=(
        "Data links this peer is in for each version: it opens half of them at once and, 5 s later, as many "
        "more as the links others opened to it leave short (others may open more). Each link costs a data "
        "channel and a have message per piece, so linking every version to every neighbour costs in proportion "
        "to them."))
    dht_providers: float = Field(DHT_PROVIDERS_WANTED, description=(
        "About how many peers of a large run announce each version on the DHT: each draws whether it does, with "
        "probability dht_providers / peers known (the signer always does). `swarm bench scale` lowers it so that a "
        "version costs its peers the DHT work it would cost a peer of the run size it estimates."))

    @model_validator(mode="after")
    def _check_ranges(self) -> "MirrorSection":
        if self.keep_versions < 1:
            raise UserError("keep_versions must be at least 1")
        if self.links_per_version < 1:
            raise UserError("links_per_version must be at least 1")
        if not 0 <= self.dht_providers <= 1_000_000:
            raise UserError(f"dht_providers {self.dht_providers} is outside 0..1,000,000")
        if not 256 <= self.piece_kb <= 4096:
            raise UserError(f"piece size {self.piece_kb} KiB is outside 256..4096 KiB")
        return self


class LimitsSection(ConfigSection):
    """[limits] Budgets that bound what this peer spends on others: upload bandwidth and connections."""

    upload_mbps: float = Field(0.0, description=(
        "Upload cap of this peer in megabits per second, shared by every version it serves (0: unlimited)."))
    max_peers: int = Field(32, description=(
        "Upper bound on data connections this peer keeps open; past it plus 8, the libp2p connections nothing uses "
        "close (p2p/host/conn_trim.py)."))
    new_peers_per_s: float = Field(2.0, description=(
        "Peers this peer has never dialed nor served for a minute that it accepts a second, node-wide, after a "
        "burst of 64 (p2p/host/inbound_admission.py): each costs about 30 ms of CPU (handshake, identify, pubsub), "
        "so a churning crowd of fresh identities stays under a tenth of a core. A public bootstrap peer of a large "
        "swarm that many peers join at once may raise it."))
    inbound_handshakes_per_s: float = Field(32.0, description=(
        "Inbound TCP connections this peer starts a handshake for a second, node-wide, after a burst of 64; the "
        "excess is closed before its handshake, and dialers retry. Known peers need one too (who dials is known "
        "only after the handshake), so it sits well above what honest reconnections ask; new_peers_per_s bounds "
        "the costlier work after it."))
    data_exempt_loopback: bool = Field(False, description=(
        "Lift the data port's per-IP cap on sockets still presenting their token for 127.0.0.0/8 and ::1. Only "
        "for a simulation or benchmark that runs every peer on loopback (`swarm sim` sets it); a peer that other "
        "local users can reach keeps it off, or local strangers can push honest local peers off the fast data "
        "path."))

    @model_validator(mode="after")
    def _check_ranges(self) -> "LimitsSection":
        if self.upload_mbps < 0:
            raise UserError("upload_mbps must not be negative")
        if not (self.new_peers_per_s > 0 and self.inbound_handshakes_per_s > 0):  # NaN fails too
            raise UserError("new_peers_per_s and inbound_handshakes_per_s must be positive")
        return self

    def inbound_limits(self) -> InboundLimits:
        """The host's node-wide admission of inbound connections (p2p.host.inbound_admission)."""
        return InboundLimits(handshakes_per_s=self.inbound_handshakes_per_s, strangers_per_s=self.new_peers_per_s)


class TrainerRoleSection(ConfigSection):
    """[trainer] The trainer role: what it writes into every version, how it gates rollouts."""

    config: ConfigPath | None = Field(None, description=(
        "TOML file of the trainer's GRPO and curriculum settings (trainer role; see trainer/config.py)."))
    precision: str = Field("float32", description=(
        "Trainer role: what the run's workers generate in, written into every manifest: float32 (CPU workers) or "
        "bfloat16 (vLLM on GPUs); validators take their sampling and logprob tolerances from it."))
    keyframe_every: int = Field(0, description=(
        "Trainer role: publish every Nth version whole, without a patch over its parent (0 = only when a patch "
        "would not pay; every version carries its full files anyway, so a late peer never needs a chain)."))
    prompts_per_worker: int = Field(4, description=(
        "Prompts each inference peer answers per policy version (trainer role: written into every manifest)."))
    replicas: int = Field(2, description="Validators assigned to each rollout (trainer role).")
    quorum: int = Field(2, description=(
        "Accepting votes a rollout needs (trainer role); a rejecting majority rejects it."))
    validator_keys: StrTuple = Field((), description=(
        "Trainer role: the only validators it names in its versions (hex public keys, peer ids or key files); "
        "empty: every peer that announces the validator role. Why: any peer may announce it, and a worker that "
        "also ran enough validators under other keys could vote its own rollouts through."))
    quorum_timeout_s: float = Field(120.0, description=(
        "Seconds a rollout may wait for its votes before it times out unaccepted (trainer role)."))
    exit_when_trained: bool = Field(False, description=(
        "Trainer role: stop the peer once the configured steps are done (simulations)."))
    report_to: str = Field("", description=(
        "Trainer role: experiment trackers of its steps (trainer.tracking: tensorboard, wandb, comma-separated, or "
        "none), writing under the data directory's training/; empty: what the trainer config says."))

    @model_validator(mode="after")
    def _check_ranges(self) -> "TrainerRoleSection":
        try:
            parse_report_to(self.report_to)
        except TrainerError as exc:
            raise UserError(str(exc)) from None
        if not 1 <= self.quorum <= self.replicas:
            raise UserError(f"quorum {self.quorum} must be between 1 and replicas ({self.replicas})")
        if self.keyframe_every < 0:
            raise UserError("keyframe_every must be 0 (never by schedule) or a positive number of versions")
        if self.prompts_per_worker < 1:
            raise UserError("prompts_per_worker must be at least 1")
        if self.precision not in PRECISIONS:
            raise UserError(f"unknown precision {self.precision!r}: choose from {', '.join(PRECISIONS)}")
        if self.validator_keys:
            listed = {parse_public_key(text, "--validator-key") for text in self.validator_keys}
            if len(listed) < self.quorum:
                raise UserError(f"--validator-key lists {len(listed)} distinct key(s) but the quorum needs "
                                f"{self.quorum} validators: no rollout could ever be accepted")
        return self


@dataclass(frozen=True)
class TrainerSettings:
    """What the trainer role reads of a peer's configuration: its [trainer] section, and the piece size of the
    versions it publishes ([mirror] piece_kb)."""

    trainer: TrainerRoleSection
    piece_kb: int


class InferenceSection(ConfigSection):
    """[inference] The inference role: how it generates."""

    backend: str = Field("torch", description=(
        "Generation backend of the inference role: torch (CPU, any machine) or vllm (GPU; `./install.sh --gpu`)."))
    gpu_memory: float = Field(0.3, description=(
        "Inference role with the vllm backend: the share of the GPU's memory vLLM may take (weights and KV "
        "cache); raise it (e.g. 0.85) on a GPU this peer does not share with a validator or trainer."))

    @model_validator(mode="after")
    def _check_ranges(self) -> "InferenceSection":
        if self.backend not in BACKENDS:
            raise UserError(f"unknown backend {self.backend!r}: choose from {', '.join(BACKENDS)}")
        if not 0.05 <= self.gpu_memory <= 0.95:
            raise UserError(f"gpu_memory {self.gpu_memory} is outside 0.05..0.95 (a share of the GPU's memory)")
        return self


class ReachSection(ConfigSection):
    """[reach] Whether others can dial this peer, and the relays that carry it when they cannot (p2p/reach/probe.py)."""

    mode: str = Field("auto", description=(
        'Reachability: "auto" asks the bootstrap peers to dial back; "public" or "private" says it.'))
    hole_punch: bool = Field(True, description=(
        "Upgrade relayed connections to direct ones by hole punching (DCUtR) where the NATs allow it."))
    max_relays: int = Field(2, description="Relays a private peer reserves a slot on (one relayed address each).")
    relay_serve: bool = Field(True, description="Serve as a relay for private peers when publicly reachable.")
    relay_max_reservations: int = Field(32, description=(
        "Private peers that may hold a relayed address on this relay at once."))
    relay_circuit_mbps: float = Field(16.0, description=(
        "Bandwidth cap of one relayed connection through this relay, each direction, Mbit/s (0: none)."))
    relay_total_mbps: float = Field(24.0, description=(
        "Bandwidth cap of all relayed connections through this relay together, Mbit/s (0: none); each relayed "
        "MiB/s costs about 3 % of a core."))
    relay_circuit_duration_s: int = Field(3600, description="A relayed connection is cut after this many seconds.")
    relay_circuit_mb: int = Field(4096, description="MiB one relayed connection may carry before it is cut.")

    @model_validator(mode="after")
    def _check_ranges(self) -> "ReachSection":
        try:
            self.host_config()
        except HostError as exc:
            raise UserError(str(exc)) from None
        return self

    def host_config(self) -> ReachConfig:
        """The host's reachability settings (p2p.reach.probe.ReachConfig)."""
        limits = RelayLimits(serve=self.relay_serve, max_reservations=self.relay_max_reservations,
                             circuit_mbps=self.relay_circuit_mbps, total_mbps=self.relay_total_mbps,
                             circuit_duration_s=self.relay_circuit_duration_s, circuit_mb=self.relay_circuit_mb)
        return ReachConfig(mode=self.mode, max_relays=self.max_relays, hole_punch=self.hole_punch, relay=limits)


class PeerConfig(BaseModel):
    """Every setting of one peer process, by section. A new setting is one field, with its description and default,
    in the section of the role that reads it (a new section: a ConfigSection class and one field here); its dotted
    name, `--set`, `swarm config show` and the flat-file mapping follow from that. Field names stay unique across
    sections, so a flat [peer] table still finds each key's section."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    peer: PeerSection = PeerSection()
    mirror: MirrorSection = MirrorSection()
    limits: LimitsSection = LimitsSection()
    trainer: TrainerRoleSection = TrainerRoleSection()
    inference: InferenceSection = InferenceSection()
    reach: ReachSection = ReachSection()

    def reach_config(self) -> ReachConfig:
        """The host's reachability settings (p2p.reach.probe.ReachConfig) from the [reach] section."""
        return self.reach.host_config()


SECTIONS: Sections = {name: info.annotation for name, info in PeerConfig.model_fields.items()}
FLAT_NAMES: dict[str, str] = {field: f"{name}.{field}" for name, cls in SECTIONS.items() for field in cls.model_fields}
"""Each field's dotted key by its bare name (field names are unique across sections): how a flat [peer] table,
top-level keys and code that names fields (`load_config(None, {"quorum": 1})`) reach their section."""
FLAT_NAMES["trainer_config"] = "trainer.config"
FLAT_NAMES["reach"] = "reach.mode"


def load_config(path: Path | None, overrides: dict, sets: list[str] | tuple = ()) -> PeerConfig:
    """The TOML file (optional), then the non-None `overrides` (bare or dotted names: the command's flags), then
    each `--set SECTION.FIELD=VALUE`; every value checked against its field's type, each section validated."""
    settings = file_settings(path) if path is not None else []
    given = {_dotted(key, "the command line"): value for key, value in overrides.items()
             if value is not None and value != ()}
    settings += [(key, value, "the command line") for key, value in given.items()]
    for text in sets:
        _refuse_trainer_setting(text)
        key, value, origin = parse_assignment(text, SECTIONS, UserError)
        if key in given:
            raise UserError(f"{key} is given twice, by its own flag and by --set: give it once")
        settings.append((key, value, origin))
    return PeerConfig(**build_sections(SECTIONS, settings, UserError))


def _refuse_trainer_setting(text: str) -> None:
    """`--set trainer.lr=...` on a peer names the trainer's own config (a file of its own), not the trainer role's
    section: say where it goes instead of only "unknown"."""
    section, _, field = text.partition("=")[0].strip().partition(".")
    if section == "trainer" and field in TrainerConfig.model_fields and field not in TrainerRoleSection.model_fields:
        raise UserError(f"trainer.{field} is a setting of the trainer's own config, not of the peer: put it in the "
                        "TOML file that --trainer-config names (`swarm config show --role trainer` prints one)")


def _dotted(key: str, origin: str) -> str:
    dotted = key if "." in key else FLAT_NAMES.get(key, key)
    check_key(dotted, SECTIONS, origin, UserError)
    return dotted


def file_settings(path: Path) -> list[Setting]:
    """A peer TOML file's settings: section tables, or the flat form (one [peer] table, or top-level keys)."""
    origin = f"config file {path}"
    settings = []
    for name, value in read_toml(path, UserError).items():
        if name in SECTIONS and isinstance(value, dict):
            for field, item in value.items():
                own = f"{name}.{field}"
                key = own if field in SECTIONS[name].model_fields or name != "peer" else FLAT_NAMES.get(field, own)
                settings.append((key, item, origin))
        else:
            settings.append((FLAT_NAMES.get(name, name), value, origin))
    for key, value, _ in settings:
        check_key(key, SECTIONS, origin, UserError)
    return [(key, _config_bootstrap(value, path) if key == "peer.bootstrap" else value, origin)
            for key, value, origin in settings]


def _config_bootstrap(value: object, path: Path) -> object:
    """A config file's bootstrap entry, each multiaddr checked and a bad one named by the file and its position
    (once merged, the peer could not tell it from --bootstrap)."""
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list) or not all(isinstance(item, str) for item in items):
        return value  # the type check names it
    try:
        return parse_bootstrap_lines(tuple(items), f"config file {path}, bootstrap")
    except BootstrapError as exc:
        raise UserError(str(exc)) from None


def render_toml(config: PeerConfig) -> str:
    """The effective config as a TOML file that loads back to the same config, every field described."""
    return "\n".join(render_section(name, getattr(config, name)) for name in SECTIONS)
