"""Probation: a worker's groups are validated from its first one, but trained beside proven workers' only within a
bounded share of each batch until its record of accepted groups proves it.

Why: a worker's history (swarm.roles.gate_evidence) bans a steering or cheaper-model worker after a few of its
groups, but identities are free, so a crowd answers one version's slots under each identity and retires it before
any history is long enough to judge. Without probation every such group was trained, and a crowd of ten identities
per version filled every batch. With it:

- a worker is *proven* once `graduate_after` of its groups were accepted by a quorum (banned workers never are); it
  counts accepted groups, not trained ones, so a fresh honest worker graduates after a bounded number of groups
  whatever the share below lets it train meanwhile;
- while any proven worker answers a version in the async window, unproven workers together fill at most
  `unproven_share` of a batch: at most share / (1 - share) unproven groups per proven group taken. The bound is
  node-wide and does not depend on how many identities share it;
- while no proven worker answers (a run's first versions), unproven workers may fill the whole batch, else nothing
  would ever train; a crowd then competes with the honest newcomers, and the groups of the workers with the
  longest records go first, so identities answering one version each lose to workers that stay.

State is bounded node-wide: at most `max_workers` unproven records (least recently seen forgotten first) and as
many proven ones, kept apart so that a crowd of fresh identities evicts only other unproven records; a proven
worker forgotten starts unproven again, which only costs it training share.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass


@dataclass(frozen=True)
class ProbationConfig:
    """graduate_after: groups of a worker a quorum must accept before it is proven (float32 history bans steering
    after 3-7 groups and int8 decoding after 1-6, so most cheaters are banned before they graduate);
    unproven_share: the largest share of a batch unproven workers fill while a proven worker answers;
    max_workers: the most unproven and the most proven workers remembered (each)."""

    graduate_after: int = 8
    unproven_share: float = 0.2
    max_workers: int = 10_000

    def __post_init__(self) -> None:
        if self.graduate_after < 0 or not 0.0 <= self.unproven_share < 1.0 or self.max_workers < 1:
            raise ValueError("graduate_after >= 0, 0 <= unproven_share < 1 and max_workers >= 1 are required")

    def unproven_allowed(self, proven: int) -> int:
        """The most unproven groups a batch holding `proven` proven groups may take."""
        return int(proven * self.unproven_share / (1.0 - self.unproven_share) + 1e-9)


class Probation:
    """Each worker's count of accepted groups, and the batches that respect the unproven share (pure state)."""

    def __init__(self, config: ProbationConfig | None = None) -> None:
        self.config = config or ProbationConfig()
        self._unproven: OrderedDict[str, int] = OrderedDict()  # worker -> accepted groups, least recent first
        self._proven: OrderedDict[str, None] = OrderedDict()

    def is_proven(self, worker: str) -> bool:
        return worker in self._proven

    def record(self, worker: str) -> int:
        """Accepted groups counted for `worker` (graduate_after or more once proven)."""
        return self.config.graduate_after if worker in self._proven else self._unproven.get(worker, 0)

    def size(self) -> int:
        return len(self._unproven) + len(self._proven)

    def on_accepted(self, worker: str) -> None:
        """One more of `worker`'s groups accepted by a quorum."""
        if worker in self._proven:
            self._proven.move_to_end(worker)
            return
        count = self._unproven.pop(worker, 0) + 1
        if count >= self.config.graduate_after:
            _bounded_put(self._proven, worker, None, self.config.max_workers)
        else:
            _bounded_put(self._unproven, worker, count, self.config.max_workers)

    def forget(self, worker: str) -> None:
        """A banned worker keeps no record."""
        self._unproven.pop(worker, None)
        self._proven.pop(worker, None)

    def batch(self, ranked: list, n: int, proven_active: bool) -> tuple[list, list]:
        """(up to `n` groups to train, the rest) from `ranked` (freshest first): proven workers' groups first, then
        unproven ones by their workers' records, within the share while `proven_active`."""
        proven = [g for g in ranked if g.worker in self._proven][:n]
        unproven = sorted((g for g in ranked if g.worker not in self._proven), key=lambda g: -self.record(g.worker))
        room = n - len(proven)
        if proven_active:
            room = min(room, self.config.unproven_allowed(len(proven)))
        chosen = {id(g) for g in proven + unproven[:room]}
        return [g for g in ranked if id(g) in chosen], [g for g in ranked if id(g) not in chosen]

    def trainable(self, groups: list, proven_active: bool) -> int:
        """How many of `groups` a batch as large as all of them may take."""
        return len(self.batch(groups, len(groups), proven_active)[0])

    def export(self) -> dict:
        """The records as plain JSON values, least recently seen first (swarm.roles.gate_state)."""
        return {"unproven": [[w, n] for w, n in self._unproven.items()], "proven": list(self._proven)}

    def load(self, unproven: list[tuple[str, int]], proven: list[str]) -> None:
        """Replace the records by validated ones (swarm.roles.gate_state checks types and bounds)."""
        self._unproven, self._proven = OrderedDict(), OrderedDict()
        for worker in proven:
            _bounded_put(self._proven, worker, None, self.config.max_workers)
        for worker, count in unproven:
            if worker not in self._proven:
                _bounded_put(self._unproven, worker, min(count, max(0, self.config.graduate_after - 1)),
                             self.config.max_workers)


def _bounded_put(table: OrderedDict, key: str, value: int | None, bound: int) -> None:
    table.pop(key, None)
    table[key] = value
    while len(table) > bound:
        table.popitem(last=False)
