"""The slots this worker has published, kept on disk so that a restarted worker never answers a slot twice.

Why: a rollout's identity is its slot (verify.rollout.Slot), and every gate and validator refuses a second group
for a slot and counts it against its worker. A worker that restarts in the middle of a version regenerates that
version's prompts, and on non-deterministic kernels (vLLM, bf16 reductions) the new groups have other bytes: each
one would be a resubmission, and with four or more prompts per worker an honest peer would be banned for a crash.
The worker therefore records a slot before it publishes the slot's group (write-ahead): a crash between the two
loses that group's work, never the worker's standing.

Bounded by the async window: the trainer and validators refuse groups older than `newest - async_level`, so slots of
such versions can never be sent again and are forgotten; the file holds at most the slots of `async_level + 1`
versions. Written atomically (a temporary file renamed over the old one), so a crash never leaves half a file.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from verify.rollout import Slot

FORMAT_VERSION = 1


class PublishedSlotsUnreadable(ValueError):
    """The ledger file exists but cannot be read; the message names the file and what to do."""

    user_facing = True


class PublishedSlots:
    """Slot key -> policy version of every slot this worker published inside the async window, mirrored to `path`."""

    def __init__(self, path: Path, slots: dict[bytes, int] | None = None) -> None:
        self.path = Path(path)
        self._slots: dict[bytes, int] = dict(slots or {})

    @classmethod
    def load(cls, path: Path) -> "PublishedSlots":
        """The ledger stored at `path` (empty when there is none yet); PublishedSlotsUnreadable when the file is
        there but is not a ledger. It is never discarded silently: without it, this worker could not tell which
        slots it already answered."""
        path = Path(path)
        try:
            text = path.read_text()
        except FileNotFoundError:
            return cls(path)
        except OSError as exc:
            raise PublishedSlotsUnreadable(f"the published-slots file {path} cannot be read ({exc.strerror})") from None
        return cls(path, _parse(text, path))

    def __len__(self) -> int:
        return len(self._slots)

    def __contains__(self, slot: Slot) -> bool:
        return slot.key() in self._slots

    def unpublished(self, slots: list[Slot]) -> list[Slot]:
        """The slots of `slots` this worker has not published yet, in order."""
        return [slot for slot in slots if slot not in self]

    def record(self, slots: list[Slot], floor: int) -> None:
        """Remember `slots` as published and forget the slots of versions below `floor` (the async window's oldest),
        then write the ledger. Called before the groups go out."""
        for slot in slots:
            self._slots[slot.key()] = slot.policy_version
        self._slots = {key: version for key, version in self._slots.items() if version >= floor}
        self._save()

    def _save(self) -> None:
        body = {"v": FORMAT_VERSION, "slots": {key.hex(): version for key, version in self._slots.items()}}
        self.path.parent.mkdir(parents=True, exist_ok=True)
        partial = self.path.with_name(self.path.name + ".tmp")
        with open(partial, "w") as out:
            json.dump(body, out)
            out.flush()
            os.fsync(out.fileno())
        os.replace(partial, self.path)


def _parse(text: str, path: Path) -> dict[bytes, int]:
    problem = (f"the published-slots file {path} is not one this worker wrote; move it away to start afresh, at the "
               "risk of answering a slot of the current versions twice")
    try:
        body = json.loads(text)
    except ValueError:
        raise PublishedSlotsUnreadable(problem) from None
    slots = body.get("slots") if isinstance(body, dict) and body.get("v") == FORMAT_VERSION else None
    if not isinstance(slots, dict):
        raise PublishedSlotsUnreadable(problem)
    parsed = {}
    for key, version in slots.items():
        if not (_is_key(key) and type(version) is int and version >= 0):
            raise PublishedSlotsUnreadable(problem)
        parsed[bytes.fromhex(key)] = version
    return parsed


def _is_key(text: str) -> bool:
    return len(text) == 64 and all(c in "0123456789abcdef" for c in text)
