"""What a validator concludes about a rollout group: one CheckResult per check, one Verdict per group.

Why a module of its own, without torch: the checks (verify/checks.py) and the verifier (verify/verifier.py) build
these, while the slot ledger (verify/slots.py) and a worker's history (verify/worker_history.py) also write
verdicts of their own (a resubmitted slot, a banned worker) without running any check, and the gates that use them
must not load torch.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from verify.neartie import NearTies


@dataclass(frozen=True)
class CheckResult:
    """name: which check; ok: passed; reason: why it failed, in one sentence ('' when ok); near_ties: the
    sampling check's flips and gaps (verify/neartie.py), which a worker's history sums across its groups."""

    name: str
    ok: bool
    reason: str = ""
    near_ties: NearTies | None = field(default=None, compare=False)


@dataclass(frozen=True)
class Verdict:
    """rollout_id: BLAKE3 of the group's canonical bytes; accepted: every check passed; checks: in the order run."""

    rollout_id: bytes
    accepted: bool
    checks: tuple[CheckResult, ...]

    @property
    def reason(self) -> str:
        """The first failed check as 'name: reason' ('' when accepted)."""
        failed = [c for c in self.checks if not c.ok]
        return f"{failed[0].name}: {failed[0].reason}" if failed else ""
