"""The peer's typed configuration: one dataclass, loadable from TOML, overridable by CLI flags.

Why one config for all roles: a process may hold several roles (the local simulation runs many), and the fields
they share (run, data directory, network) must agree. Role-specific settings have their own sections so an unknown
key is still caught. Every field is documented where it is declared.
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass, fields, replace
from pathlib import Path

from swarm.errors import UserError
from swarm.policy.runspec import PRECISIONS

ROLES = ("trainer", "inference", "validator", "seed")
_RUN_NAME = re.compile(r"[A-Za-z0-9._-]{1,64}")
"""Run names become parts of gossip topics, DHT keys and directory names."""
BACKENDS = ("torch", "vllm")  # inference.select.open_backend's names (kept here: a seed-only peer never imports torch)
DEVICES = ("auto", "cpu", "cuda")  # inference.select.resolve_device's names


@dataclass(frozen=True)
class PeerConfig:
    roles: tuple[str, ...] = ("seed",)
    """Roles this process plays: any of trainer, inference, validator, seed."""
    run: str = "default"
    """The run's name; envelopes and DHT records of other runs are dropped."""
    trainer_key: str = ""
    """Hex Ed25519 public key of the run's trainer (or a path to a key file); only manifests it signed are loaded.
    Empty: trust the first manifest signer seen on the run topic (test networks only; printed as a warning)."""
    data_dir: Path = Path("./swarm-data")
    """Where the identity key, the piece store and the lock file live. One process per data directory."""
    listen: tuple[str, ...] = ("/ip4/127.0.0.1/tcp/0",)
    """Multiaddrs to listen on; tcp/0 picks a free port."""
    bootstrap: tuple[str, ...] = ()
    """Bootstrap multiaddrs; when empty, bootstrap_peers.txt is read."""
    announce: tuple[str, ...] = ()
    """Multiaddrs to give other peers instead of the listen addresses (e.g. the public address of a NAT port
    forward); empty: the listen addresses, /ip4/0.0.0.0 expanded to this machine's interface addresses."""
    bootstrap_file: Path = Path("bootstrap_peers.txt")
    """File of bootstrap multiaddrs, one per line, '#' comments."""
    keep_versions: int = 3
    """Policy versions kept in the store (the async window plus one); older ones are garbage-collected."""
    upload_mbps: float = 0.0
    """Upload cap of this peer in megabits per second, shared by every version it serves (0: unlimited)."""
    piece_kb: int = 1024
    """Piece size for policies this peer publishes, in KiB."""
    max_peers: int = 32
    """Upper bound on data connections this peer keeps open."""
    data_exempt_loopback: bool = False
    """Lift the data port's per-IP cap on sockets still presenting their token for 127.0.0.0/8 and ::1. Only for
    a simulation or benchmark that runs every peer on loopback (`swarm sim` sets it); a peer that other local
    users can reach keeps it off, or local strangers can push honest local peers off the fast data path."""
    reseed: bool = True
    """Serve pieces to others as soon as they verify (off only for the single-origin baseline)."""
    exit_when_complete: bool = False
    """Exit once the newest policy is complete (benchmarks); normally peers seed until stopped."""
    status_every_s: float = 2.0
    """Seconds between progress lines."""
    heartbeat_every_s: float = 6.0
    """Seconds between heartbeats (roles, addresses, policies held). Why not every status line: a heartbeat floods
    the whole run, and in the default simulation heartbeats every 3 s were 61 % of all gossip deliveries; every 6 s
    a peer still gets five chances within `peer_silence_s`."""
    bootstrap_redial_s: float = 10.0
    """Seconds between redials of bootstrap peers this peer is not connected to (one that restarted, or was not up
    yet when this peer started)."""
    peer_silence_s: float = 30.0
    """A peer not heard from (no heartbeat) this long is forgotten: its roles no longer count, so a trainer stops
    naming a validator that left in the versions it publishes."""
    model: str = "tiny"
    """Base model of the trainer, inference and validator roles: tiny, smollm2, a local HF directory or a Hugging
    Face hub id in the local Hugging Face cache (HF_HUB_CACHE)."""
    backend: str = "torch"
    """Generation backend of the inference role: torch (CPU, any machine) or vllm (GPU; `./install.sh --gpu`)."""
    gpu_memory: float = 0.3
    """Inference role with the vllm backend: the share of the GPU's memory vLLM may take (weights and KV cache);
    raise it (e.g. 0.85) on a GPU this peer does not share with a validator or trainer."""
    precision: str = "float32"
    """Trainer role: what the run's workers generate in, written into every manifest: float32 (CPU workers) or
    bfloat16 (vLLM on GPUs); validators take their sampling and logprob tolerances from it."""
    device: str = "auto"
    """Where the validator role prefills and the trainer role trains: auto (a CUDA GPU when torch sees one, else
    the CPU), cpu or cuda."""
    trainer_config: Path | None = None
    """TOML file of the trainer's GRPO and curriculum settings (trainer role; see trainer/config.py)."""
    prompts_per_worker: int = 4
    """Prompts each inference peer answers per policy version (trainer role: written into every manifest)."""
    replicas: int = 2
    """Validators assigned to each rollout (trainer role)."""
    quorum: int = 2
    """Accepting votes a rollout needs (trainer role); a rejecting majority rejects it."""
    validator_keys: tuple[str, ...] = ()
    """Trainer role: the only validators it names in its versions (hex public keys, peer ids or key files); empty:
    every peer that announces the validator role. Why: any peer may announce it, and a worker that also ran enough
    validators under other keys could vote its own rollouts through."""
    quorum_timeout_s: float = 120.0
    """Seconds a rollout may wait for its votes before it times out unaccepted (trainer role)."""
    exit_when_trained: bool = False
    """Trainer role: stop the peer once the configured steps are done (simulations)."""
    cheat: str = ""
    """Inference role, for demonstrations and tests only: 'reward' claims reward 1.0 for every completion."""

    def validate(self) -> "PeerConfig":
        unknown = [r for r in self.roles if r not in ROLES]
        if unknown or not self.roles:
            raise UserError(f"unknown role {unknown[0] if unknown else '(none)'}: choose from {', '.join(ROLES)}")
        if self.keep_versions < 1:
            raise UserError("keep_versions must be at least 1")
        if not 256 <= self.piece_kb <= 4096:
            raise UserError(f"piece size {self.piece_kb} KiB is outside 256..4096 KiB")
        if not 1 <= self.quorum <= self.replicas:
            raise UserError(f"quorum {self.quorum} must be between 1 and replicas ({self.replicas})")
        if self.bootstrap_redial_s <= 0:
            raise UserError("bootstrap_redial_s must be positive")
        if self.heartbeat_every_s <= 0:
            raise UserError("heartbeat_every_s must be positive")
        if self.peer_silence_s < 3 * self.heartbeat_every_s:
            raise UserError(f"peer_silence_s {self.peer_silence_s:g} must be at least 3 heartbeats "
                            f"({3 * self.heartbeat_every_s:g} s)")
        if self.prompts_per_worker < 1:
            raise UserError("prompts_per_worker must be at least 1")
        if self.backend not in BACKENDS:
            raise UserError(f"unknown backend {self.backend!r}: choose from {', '.join(BACKENDS)}")
        if not 0.05 <= self.gpu_memory <= 0.95:
            raise UserError(f"gpu_memory {self.gpu_memory} is outside 0.05..0.95 (a share of the GPU's memory)")
        if self.precision not in PRECISIONS:
            raise UserError(f"unknown precision {self.precision!r}: choose from {', '.join(PRECISIONS)}")
        if self.device not in DEVICES:
            raise UserError(f"unknown device {self.device!r}: choose from {', '.join(DEVICES)}")
        if self.cheat not in ("", "reward"):
            raise UserError(f"unknown cheat {self.cheat!r}")
        if self.upload_mbps < 0:
            raise UserError("upload_mbps must not be negative")
        if self.validator_keys:
            from swarm.policy.trust import parse_public_key

            listed = {parse_public_key(text, "--validator-key") for text in self.validator_keys}
            if len(listed) < self.quorum:
                raise UserError(f"--validator-key lists {len(listed)} distinct key(s) but the quorum needs "
                                f"{self.quorum} validators: no rollout could ever be accepted")
        if not _RUN_NAME.fullmatch(self.run):
            raise UserError(f"run name {self.run!r} must be 1 to 64 letters, digits, '.', '_' or '-'")
        return self


_TUPLE_FIELDS = {"roles", "listen", "bootstrap", "announce", "validator_keys"}
_PATH_FIELDS = {"data_dir", "bootstrap_file", "trainer_config"}


def load_config(path: Path | None, overrides: dict) -> PeerConfig:
    """Read a TOML file (section [peer] or top level), then apply non-None CLI overrides; validate the result."""
    values: dict = {}
    if path is not None:
        try:
            raw = tomllib.loads(Path(path).read_text())
        except FileNotFoundError:
            raise UserError(f"config file {path} does not exist") from None
        except tomllib.TOMLDecodeError as exc:
            raise UserError(f"config file {path} is not valid TOML: {exc}") from None
        values = raw.get("peer", raw)
    known = {f.name for f in fields(PeerConfig)}
    for key in values:
        if key not in known:
            raise UserError(f"unknown config key {key!r} in {path}; known keys: {', '.join(sorted(known))}")
    if "bootstrap" in values:  # named by its file here: once merged, the peer cannot tell it from --bootstrap
        values["bootstrap"] = _config_bootstrap(values["bootstrap"], path)
    values.update({k: v for k, v in overrides.items() if v is not None and v != ()})
    return replace(PeerConfig(), **{key: _typed(key, value) for key, value in values.items()}).validate()


def _config_bootstrap(value: object, path: Path | None) -> tuple[str, ...]:
    """A config file's bootstrap entry, each multiaddr checked and a bad one named by the file and its position."""
    from p2p.bootstrap import parse_bootstrap_lines
    from p2p.errors import BootstrapError

    try:
        return parse_bootstrap_lines(_typed("bootstrap", value), f"config file {path}, bootstrap")
    except BootstrapError as exc:
        raise UserError(str(exc)) from None


_KINDS = {bool: ("true or false", (bool,)), int: ("a whole number", (int,)), float: ("a number", (int, float)),
          str: ("a string", (str,))}


def _typed(key: str, value: object) -> object:
    """`value` as field `key` holds it, or one sentence naming the key and what it takes (a TOML string where a
    number belongs failed later as "'<' not supported between instances of 'str' and 'int'")."""
    if key in _TUPLE_FIELDS:
        items = (value,) if isinstance(value, str) else value
        if not isinstance(items, (list, tuple)) or not all(isinstance(item, str) for item in items):
            raise UserError(f"config key {key} takes a string or a list of strings, got {value!r}")
        return tuple(items)
    if key in _PATH_FIELDS:
        if not isinstance(value, (str, Path)):
            raise UserError(f"config key {key} takes a path, got {value!r}")
        return Path(value)
    what, kinds = _KINDS[type(getattr(_DEFAULTS, key))]
    if not isinstance(value, kinds) or (isinstance(value, bool) and bool not in kinds):
        raise UserError(f"config key {key} takes {what}, got {value!r}")
    return float(value) if float in kinds else value


_DEFAULTS = PeerConfig()
