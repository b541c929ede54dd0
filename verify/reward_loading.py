"""A run's own reward function, named `module:function` (an installed module) or `path/to/file.py:function`.

The interface is TRL's `reward_funcs`: `fn(completions: list[str], **row_fields) -> list[float]`, the row's
fields (prompt, answer, metadata, ...; the prompt also as `prompts`, TRL's name) passed as keyword lists as long
as `completions`. The built-in scorers (verify/reward_fns.py) are instances of it too.

Why a hash of the code: a validator recomputes every claimed reward, so it must run the trainer's very function.
The run spec names the reward and the BLAKE3 hash of its module's source bytes; a peer whose copy hashes
differently (or that has none) cannot vote on the run. The bytes are read and hashed before any of them runs, so a
peer never executes a file the run did not name by its hash.
"""

from __future__ import annotations

import importlib
import importlib.util
import math
import re
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import blake3

MAX_NAME = 256
"""Longest reward name a config or a run spec may give."""
_MODULE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*")
_FUNCTION = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


class RewardError(ValueError):
    """A reward function that cannot be named, found, loaded or trusted: one sentence saying which and why."""


@dataclass(frozen=True)
class LoadedReward:
    """A reward function ready to call, with the hash every peer compares."""

    name: str  # as the config gave it: "module:function" or "path/to/file.py:function"
    fn: Callable[..., Sequence[float]]  # TRL's reward_funcs shape
    code_hash: str  # hex BLAKE3 of the source bytes of the module that defines it


def is_custom_reward(name: object) -> bool:
    """Whether `name` has the shape of a custom reward (built-in names hold no ':' but "rg:<dataset>")."""
    return isinstance(name, str) and ":" in name and not name.startswith("rg:")


def split_name(name: str) -> tuple[str, str]:
    """(module or file, function) of a reward name; one sentence when it has neither shape."""
    where, _, function = str(name).rpartition(":")
    if not where or len(name) > MAX_NAME or not _FUNCTION.fullmatch(function) or not (
            _is_file(where) or _MODULE.fullmatch(where)):
        raise RewardError(f"reward {str(name)[:80]!r} is not of the form module:function or path/to/file.py:function")
    return where, function


def _is_file(where: str) -> bool:
    return where.endswith(".py") or "/" in where


def source_bytes(name: str) -> bytes:
    """The source bytes of the module a reward name points at, read without running any of it."""
    where, _ = split_name(name)
    if _is_file(where):
        path = Path(where)
        if not path.is_file():
            raise RewardError(f"reward file {where} does not exist")
        return path.read_bytes()
    try:
        spec = importlib.util.find_spec(where)
    except (ImportError, ValueError) as exc:
        raise RewardError(f"reward module {where!r} cannot be found: {exc}") from None
    if spec is None or not spec.origin or not Path(spec.origin).is_file():
        raise RewardError(f"reward module {where!r} is not installed: give an installed module or a path to a .py "
                          f"file (path/to/file.py:function)")
    return Path(spec.origin).read_bytes()


def code_hash(name: str) -> str:
    """The hex BLAKE3 of the reward module's source bytes (what the run spec carries)."""
    return blake3.blake3(source_bytes(name)).hexdigest()


_LOADED: dict[str, LoadedReward] = {}


def load_reward(name: str, expected_hash: str | None = None) -> LoadedReward:
    """The reward `name` points at, loaded once per process; with `expected_hash`, only when its source bytes hash
    to it (checked before they run). Every failure is a RewardError of one sentence."""
    loaded = _LOADED.get(name)
    if loaded is None:
        loaded = _LOADED[name] = _load(name, expected_hash)
    if expected_hash is not None and loaded.code_hash != expected_hash:
        raise hash_mismatch(name, expected_hash, loaded.code_hash)
    return loaded


def hash_mismatch(name: str, expected: str, found: str) -> RewardError:
    return RewardError(f"reward {name} should hash {expected[:16]}... but this peer's copy hashes {found[:16]}...")


def _load(name: str, expected_hash: str | None) -> LoadedReward:
    where, function = split_name(name)
    source = source_bytes(name)
    digest = blake3.blake3(source).hexdigest()
    if expected_hash is not None and digest != expected_hash:
        raise hash_mismatch(name, expected_hash, digest)
    module = _run_file(where, source) if _is_file(where) else _import(where)
    fn = getattr(module, function, None)
    if fn is None:
        raise RewardError(f"reward module {where} has no function {function!r}")
    if not callable(fn):
        raise RewardError(f"reward {name} is a {type(fn).__name__}, not a function")
    return LoadedReward(name, fn, digest)


def _run_file(path: str, source: bytes):
    """A module built from exactly the bytes that were hashed (a later edit of the file changes nothing here)."""
    module_name = f"rlswarm_reward_{blake3.blake3(path.encode()).hexdigest()[:16]}"
    spec = importlib.util.spec_from_loader(module_name, loader=None, origin=path)
    module = importlib.util.module_from_spec(spec)
    module.__file__ = path
    sys.modules[module_name] = module  # dataclasses and pickling look their module up here
    try:
        exec(compile(source, path, "exec"), module.__dict__)  # noqa: S102 - the run's own, hash-checked reward
    except Exception as exc:  # noqa: BLE001 - whatever the file raises is the user's to see, in one line
        sys.modules.pop(module_name, None)
        raise RewardError(f"reward file {path} failed to run: {type(exc).__name__}: {exc}") from None
    return module


def _import(module: str):
    try:
        return importlib.import_module(module)
    except Exception as exc:  # noqa: BLE001 - as above: one line, never a traceback
        raise RewardError(f"reward module {module} failed to import: {type(exc).__name__}: {exc}") from None


def call_reward(fn: Callable, name: str, completions: list[str], row: dict) -> list[float]:
    """`fn` on `completions` of one row (its fields passed as lists as long as `completions`), its answer checked:
    a list of one finite number per completion, else a RewardError naming what came back."""
    fields = {key: [value] * len(completions) for key, value in row.items() if key != "completions"}
    if "prompt" in row and "prompts" not in row:  # TRL's own name for the prompts a reward_funcs function takes
        fields["prompts"] = [row["prompt"]] * len(completions)
    values = fn(completions=list(completions), **fields)  # by keyword, as TRL calls them: prompts may come first
    if not isinstance(values, (list, tuple)):
        raise RewardError(f"reward {name} returned a {type(values).__name__}, not a list of floats")
    if len(values) != len(completions):
        raise RewardError(f"reward {name} returned {len(values)} values for {len(completions)} completions")
    bad = next((v for v in values if isinstance(v, bool) or not isinstance(v, (int, float))), None)
    if bad is not None:
        raise RewardError(f"reward {name} returned a {type(bad).__name__} among its values, not a float")
    return [float(v) if math.isfinite(v) else 0.0 for v in values]
