"""What every peer of a run must agree on, carried inside the trainer's signed manifest.

Why in the manifest: the task set, the stage's data segment, how many prompts each worker answers and which
validators vote on a version's rollouts all decide whether a rollout is valid. If each peer read them from its own
config, one typo would make honest work look dishonest. The trainer writes them into `model["run_spec"]` of every
manifest it signs, so inference peers and validators take them from the only source they already trust.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from functools import lru_cache
from pathlib import Path

from p2p.identity import peer_id_from_public_bytes
from p2p.pieces.manifest import FileEntry, PolicyManifest, is_safe_file_name
from swarm.errors import UserError
from tasks import load_tasks
from tasks.errors import TaskError
from tasks.loading import is_builtin_task, is_task_file
from tasks.segments import segment
from tasks.taskset import TaskSet
from verify.reward_loading import RewardError, load_reward, split_name

PRECISIONS = ("float32", "bfloat16")  # verify.checks.PRECISIONS (named here too: seed peers never import torch)


@dataclass(frozen=True)
class RunSpec:
    task: str  # task set name (reasoning-gym), or the name of the task file that travels with the policy
    task_size: int  # prompts generated for a built-in task set
    task_config: str  # difficulty overrides of a built-in task set, as canonical JSON ("{}" for none)
    task_seed: int  # seed of the task set and of its train/held-out split
    eval_fraction: float  # share of prompts held out (never assigned)
    segment: str  # FastCuRL data segment of this version's stage: short, all or long
    prompts_per_worker: int  # prompts each inference peer answers per policy version
    async_level: int  # how many versions older than the newest a rollout may be
    replicas: int  # validators assigned to each rollout
    quorum: int  # accepting votes that settle a rollout as accepted
    validators: tuple[str, ...]  # hex Ed25519 public keys of the validators for this version's rollouts
    precision: str = "float32"
    task_root: str = ""  # hex BLAKE3 root of the task file among the manifest's files ("" for a built-in task set)
    reward: str = ""  # the run's own reward, module:function or path/to/file.py:function ("" for the tasks' own)
    reward_hash: str = ""  # hex BLAKE3 of that reward's module source bytes ("" without one)

    def to_dict(self) -> dict:
        d = asdict(self)
        d["validators"] = list(self.validators)
        return d

    @classmethod
    def from_model(cls, model: dict) -> "RunSpec":
        raw = model.get("run_spec") if isinstance(model, dict) else None
        if not isinstance(raw, dict):
            raise UserError("the policy manifest carries no run_spec; it was not published by a swarm trainer")
        try:
            spec = cls(_text(raw, "task"), _whole(raw, "task_size", 1, 1 << 31), _text(raw, "task_config", 1 << 16),
                       _whole(raw, "task_seed", 0, 1 << 63), _fraction(raw, "eval_fraction"), _text(raw, "segment"),
                       _whole(raw, "prompts_per_worker", 1, 1 << 16), _whole(raw, "async_level", 0, 1 << 10),
                       _whole(raw, "replicas", 1, 1 << 10), _whole(raw, "quorum", 1, 1 << 10), _validators(raw),
                       _text(raw, "precision", default="float32"),  # a manifest may name no precision
                       _text(raw, "task_root", default=""),  # ... nor a task file that travels with the policy
                       _text(raw, "reward", default=""), _text(raw, "reward_hash", default=""))  # ... nor a reward
        except KeyError as exc:
            raise UserError(f"the manifest's run_spec is malformed (no {exc})") from None
        if spec.task_root and not (_is_hex_root(spec.task_root) and _is_task_file_name(spec.task)):
            raise UserError("the manifest's run_spec names a task file by a malformed name or root")
        if not spec.task_root and not _is_builtin_task(spec.task):  # a path or hub id each peer would read its own
            raise UserError("the manifest's run_spec names a task set that is neither built in nor sent with it")
        if spec.segment not in ("short", "all", "long") or not 1 <= spec.quorum <= spec.replicas:
            raise UserError("the manifest's run_spec names an unknown segment or an impossible quorum")
        if spec.reward or spec.reward_hash:
            _check_reward_name(spec)
        if spec.precision not in PRECISIONS:
            raise UserError(f"the manifest's run_spec names an unknown precision {spec.precision!r}")
        return spec

    def reward_problem(self) -> str:
        """Why this peer cannot score the run's rewards as the trainer does ("" when it can): the reward the spec
        names does not load here, or its source bytes hash to another value than the spec's."""
        if not self.reward:
            return ""
        try:
            load_reward(self.reward, expected_hash=self.reward_hash)
        except RewardError as exc:
            return str(exc)
        return ""

    def validator_keys(self) -> tuple[bytes, ...]:
        return tuple(bytes.fromhex(v) for v in self.validators)

    def quorum_reachable(self, worker: str | None = None) -> bool:
        """Whether the version names at least `quorum` validators (other than `worker`, for its rollouts): with
        fewer, no rollout of it can be accepted."""
        return len(self.validator_keys() if worker is None else self.validators_for(worker)) >= self.quorum

    def validators_for(self, worker: str) -> tuple[bytes, ...]:
        """The validators a rollout of `worker` (its peer id) is assigned among: the version's, less the worker's
        own key. Why: a peer that both generates and validates was assigned some of its own rollouts, and its
        accepting vote counted toward their quorum."""
        return tuple(k for k in self.validator_keys() if _peer_id_of(k) != worker)


@lru_cache(maxsize=1024)
def _peer_id_of(public_key: bytes) -> str:
    return peer_id_from_public_bytes(public_key)


@lru_cache(maxsize=4)
def training_tasks(task: str, task_size: int, task_config: str, task_seed: int, eval_fraction: float,
                   reward: str = ""):
    """The run's training split, identical on every peer (held-out prompts are never assigned), every prompt
    scored by the run's own reward when it names one."""
    config = json.loads(task_config) or None
    tasks = load_tasks(task, size=None if is_task_file(task) else task_size, seed=task_seed, config=config)
    train, _heldout = tasks.split(eval_fraction, seed=task_seed)
    return train.with_reward(reward) if reward else train


def eligible_indices(spec: RunSpec, directory: Path | str | None = None) -> list[int]:
    """The sorted prompt indices a version's workers are assigned from (the stage's segment of the train split)."""
    train = spec_tasks(spec, directory)
    return segment(train, spec.segment) or sorted(train.indices())


def spec_tasks(spec: RunSpec, directory: Path | str | None = None) -> TaskSet:
    """The run's training split as a version's spec names it. A task file travels with the policy (`task_root`
    set): it is read from the version's directory, where `materialize` reassembled it from pieces verified against
    the signed manifest, so every peer reads the trainer's exact bytes without being handed the file."""
    if not spec.task_root:
        return training_tasks(spec.task, spec.task_size, spec.task_config, spec.task_seed, spec.eval_fraction,
                              spec.reward)
    if directory is None:
        raise UserError(f"the run's task file {spec.task} travels with the policy: give the version's directory")
    key = (spec.task_root, spec.task_config, spec.task_seed, spec.eval_fraction, spec.reward)
    if key not in _FILE_TASKS:  # every version carries the same file: parse it once, not once per version
        if len(_FILE_TASKS) >= 4:
            _FILE_TASKS.pop(next(iter(_FILE_TASKS)))
        _FILE_TASKS[key] = training_tasks(str(Path(directory) / spec.task), spec.task_size, spec.task_config,
                                          spec.task_seed, spec.eval_fraction, spec.reward)
    return _FILE_TASKS[key]


_FILE_TASKS: dict[tuple, TaskSet] = {}


@dataclass(frozen=True)
class VersionTasks:
    """What a worker is assigned from and a validator checks against, for one policy version."""

    train: TaskSet  # the training split
    eligible: list[int]  # the stage segment's indices of it
    prompts_per_worker: int


def version_tasks(spec: RunSpec, manifest: PolicyManifest, directory: Path | str) -> VersionTasks:
    """Blocking: a version's tasks, read from its directory when its task file travels with it; raises one
    user-facing line when that file is not among the version's files or cannot be read."""
    problem = task_file_problem(spec, manifest.files) or spec.reward_problem()
    if problem:
        raise UserError(problem)
    try:
        return VersionTasks(spec_tasks(spec, directory), eligible_indices(spec, directory), spec.prompts_per_worker)
    except TaskError as exc:  # an unreadable file or a bad row: the same one line for every caller
        raise UserError(str(exc)) from None


def task_file_problem(spec: RunSpec, files: Iterable[FileEntry]) -> str:
    """Why a version's task file cannot be used (its manifest lists no file of that name and root), or ""."""
    if not spec.task_root:
        return ""
    if any(f.name == spec.task and f.root.hex() == spec.task_root for f in files):
        return ""
    return f"the run's task file {spec.task} (root {spec.task_root[:16]}...) is not among the version's files"


def _whole(raw: dict, key: str, lo: int, hi: int) -> int:
    """A run_spec integer: a true int in [lo, hi] (no bool, no string: int("7") and int(True) would pass)."""
    value = raw[key]
    if type(value) is not int or not lo <= value <= hi:
        raise UserError(f"the manifest's run_spec has {key} {value!r}, not a whole number in {lo}..{hi}")
    return value


def _fraction(raw: dict, key: str) -> float:
    value = raw[key]
    if type(value) not in (int, float) or not 0.0 <= value < 1.0:  # NaN fails the comparison too
        raise UserError(f"the manifest's run_spec has {key} {value!r}, not a fraction in [0, 1)")
    return float(value)


def _text(raw: dict, key: str, limit: int = 256, default: str | None = None) -> str:
    value = raw[key] if default is None else raw.get(key, default)
    if not isinstance(value, str) or len(value) > limit:
        raise UserError(f"the manifest's run_spec has {key} {str(value)[:40]!r}, not a string of at most {limit}")
    return value


def named_validators(model: object) -> int:
    """How many validators a signed manifest's run spec names; 0 when it carries no well-formed list of them. Only
    the run's key names validators, so peers may size things by this count where a crowd of claims must not."""
    raw = model.get("run_spec") if isinstance(model, dict) else None
    try:
        return len(_validators(raw)) if isinstance(raw, dict) else 0
    except (KeyError, UserError):
        return 0


def _validators(raw: dict) -> tuple[str, ...]:
    """64-hex-digit Ed25519 public keys: a string here was split into its characters, and a non-hex key ended the
    validator role that parsed it."""
    value = raw["validators"]
    if not isinstance(value, list) or len(value) > 1024 or not all(isinstance(v, str) and _is_hex_root(v)
                                                                   for v in value):
        raise UserError("the manifest's run_spec names its validators other than as a list of 64-hex-digit keys")
    return tuple(value)


def _check_reward_name(spec: RunSpec) -> None:
    """A reward named by a well-formed name and its 64-hex-digit hash, both or neither."""
    try:
        split_name(spec.reward)
    except RewardError:
        raise UserError("the manifest's run_spec names its reward by a malformed name") from None
    if not _is_hex_root(spec.reward_hash):
        raise UserError("the manifest's run_spec names a reward without a 64-hex-digit BLAKE3 hash of its code")


def _is_hex_root(text: str) -> bool:
    return len(text) == 64 and all(c in "0123456789abcdef" for c in text)


def _is_builtin_task(name: str) -> bool:
    """A name only a built-in task set can have: no file suffix, no hub id and no path of any depth."""
    return is_builtin_task(name) and "/" not in name


def _is_task_file_name(name: str) -> bool:
    """A bare file name a manifest may carry, ending in a task file suffix: never a path."""
    return is_safe_file_name(name) and name.endswith((".jsonl", ".parquet"))
