"""What a run's swarm looks like from the outside: the status view behind `swarm status`, as a pure aggregator.

Why: whoever starts a run, or lends GPUs to one, needs to see it: which peers are there and in which roles, which
policy versions they hold, whether workers are sending rollouts and validators voting, and what they reject. Every
peer already gossips all of that (heartbeats, rollouts, votes), so an observer only has to listen for a while.
`SwarmView` takes those messages as plain data (the network is `swarm.cli.status`'s business) and summarises them.
Rollout rewards are the workers' claims, unverified; only votes (each signature checked, each from its own voter)
say what validators accepted. `swarm status --watch` keeps one view for as long as it runs, so everything kept per
rollout is bounded (MAX_ROLLOUTS_KEPT, MAX_RECENT) and throughput is measured over the last RATE_WINDOW_S only.
"""

from __future__ import annotations

import json
import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from swarm.messages.gossip_bodies import Heartbeat
from verify.reputation import Reputation

if TYPE_CHECKING:
    from verify.votes import Vote

MAX_ROLLOUTS_KEPT = 20_000
"""Rollouts whose worker and votes the view remembers (the oldest are forgotten first)."""
MAX_RECENT = 50_000
"""Timestamps of groups and votes kept for the throughput figures."""
RATE_WINDOW_S = 60.0
"""Throughput is groups and votes per minute over this much of the most recent time."""


@dataclass
class PeerSeen:
    roles: tuple[str, ...] = ()
    holds: list[int] = field(default_factory=list)  # complete policy versions
    fetching: list[int] = field(default_factory=list)
    last_heard: float = 0.0
    groups: int = 0  # rollout groups heard from it by this observer (its own count since it started: groups_sent)
    claimed_sum: float = 0.0  # of the rewards its completions claim
    claimed_n: int = 0
    votes_accept: int = 0
    votes_reject: int = 0
    progress: dict = field(default_factory=dict)  # what its roles did (swarm.node.state.Node.note_progress)
    addrs: tuple[str, ...] = ()  # where it listens, as its heartbeat says (each ending in its own /p2p/ id)


@dataclass
class SwarmView:
    """Feed it what the run gossips during a window; `report` summarises it."""

    peers: dict[str, PeerSeen] = field(default_factory=dict)
    claims: dict[int, dict[bytes, set[str]]] = field(default_factory=dict)  # version -> manifest id -> claimants

    @property
    def versions(self) -> dict[int, bytes]:
        """Policy version -> the manifest id most peers' heartbeats gave for it (not the first to arrive, with
        which one liar could name a bogus id for the real newest version)."""
        return {v: max(ids, key=lambda i: (len(ids[i]), i)) for v, ids in self.claims.items()}
    rollout_versions: dict[int, int] = field(default_factory=dict)  # policy version -> groups generated with it
    rejected_checks: dict[str, int] = field(default_factory=dict)  # failed check -> rejecting votes naming it
    verdicts: dict[bytes, dict[str, bool]] = field(default_factory=dict)  # rollout id -> voter -> its verdict
    run_validators: frozenset[str] | None = None  # peer ids the newest verified manifest names; None: not known
    refused: int = 0  # messages refused here (rollouts of another worker, votes not signed by their sender)
    worker_of: dict[bytes, str] = field(default_factory=dict)  # rollout id -> the worker that sent it
    recent: deque = field(default_factory=lambda: deque(maxlen=MAX_RECENT))  # (time heard, "group" or "vote")

    def _peer(self, peer: str) -> PeerSeen:
        return self.peers.setdefault(peer, PeerSeen())

    def on_heartbeat(self, sender: str, beat: Heartbeat, now: float) -> None:
        """A heartbeat as gossip's validator decoded it (swarm.messages.gossip_bodies: typed, bounded, printable)."""
        seen = self._peer(sender)
        seen.roles = beat.roles
        holds, fetching = [], []
        for held in beat.policies:
            (holds if held.complete else fetching).append(held.version)
            claims = self.claims.setdefault(held.version, {})
            if held.manifest_id in claims or len(claims) < 8:
                claims.setdefault(held.manifest_id, set()).add(sender)
        seen.holds, seen.fetching, seen.last_heard = sorted(holds), sorted(fetching), now
        seen.progress = _ordered(beat.progress)
        seen.addrs = beat.addrs[:4]

    def on_rollouts(self, sender: str, items: list, now: float | None = None) -> None:
        """Parsed items of one rollout message (groups, announcements, refusals: swarm.messages.rollout_codec);
        `now`, when given, counts them in the throughput."""
        seen = self._peer(sender)
        for item in items:
            version, worker = getattr(item, "policy_version", None), getattr(item, "worker", None)
            if not isinstance(version, int) or worker != sender:
                self.refused += 1
                continue
            seen.groups += 1
            self.rollout_versions[version] = self.rollout_versions.get(version, 0) + 1
            for completion in getattr(item, "completions", ()):
                seen.claimed_sum += float(completion.reward)
                seen.claimed_n += 1
            rollout_id = _rollout_id(item)
            if rollout_id is not None:
                _bounded_put(self.worker_of, rollout_id, sender, MAX_ROLLOUTS_KEPT)
            if now is not None:
                self.recent.append((now, "group"))

    def on_votes(self, sender: str, votes: list, voter_of: Callable[[Vote], str | None],
                 now: float | None = None) -> None:
        """Votes of one message; `voter_of(vote)` is the voter's peer id when its signature checks out, else None."""
        for vote in votes:
            if voter_of(vote) != sender:
                self.refused += 1
                continue
            if now is not None:
                self.recent.append((now, "vote"))
            seen = self._peer(sender)
            if vote.accept:
                seen.votes_accept += 1
            else:
                seen.votes_reject += 1
                for name, passed, _reason in vote.checks:
                    if not passed:
                        self.rejected_checks[name] = self.rejected_checks.get(name, 0) + 1
            if vote.rollout_id not in self.verdicts:
                _bounded_put(self.verdicts, vote.rollout_id, {}, MAX_ROLLOUTS_KEPT)
            self.verdicts[vote.rollout_id][sender] = bool(vote.accept)  # a voter's latest word on it counts once

    def judged_workers(self) -> tuple[dict[str, dict[str, int]], list[str]]:
        """Per worker, its rollouts most votes heard here accepted or rejected, and the workers the trainer's
        reputation rule (verify.reputation) bans on those outcomes, replayed in the order the votes came.

        Why replayed here: no message says who is banned, and the view must not take a peer's word for it; the
        trainer settles each rollout on its assigned validators' quorum, which the majority of the votes heard
        here approximates (a tie counts for neither). Any key can sign a vote, so once a verified manifest names
        the run's validators (`run_validators`) only theirs count: a crowd of made-up voters bans no one."""
        reputation, tally = Reputation(), {}
        for rollout_id, by_voter in self.verdicts.items():
            worker = self.worker_of.get(rollout_id)
            verdicts = [accept for voter, accept in by_voter.items()
                        if self.run_validators is None or voter in self.run_validators]
            accepts = sum(verdicts)
            if worker is None or 2 * accepts == len(verdicts):
                continue
            accepted = 2 * accepts > len(verdicts)
            counts = tally.setdefault(worker, {"accepted": 0, "rejected": 0})
            counts["accepted" if accepted else "rejected"] += 1
            reputation.record(worker, accepted)
        return tally, sorted(reputation.banned())

    def throughput(self, now: float, window_s: float) -> dict:
        """Groups and votes per minute over the last RATE_WINDOW_S (or the whole window, when shorter)."""
        span = max(1e-9, min(window_s, RATE_WINDOW_S))
        since = now - span
        groups = sum(1 for t, kind in self.recent if t >= since and kind == "group")
        votes = sum(1 for t, kind in self.recent if t >= since and kind == "vote")
        return {"over_s": round(span, 1), "groups_per_min": round(60 * groups / span, 1),
                "votes_per_min": round(60 * votes / span, 1)}

    def report(self, now: float, window_s: float) -> dict:
        judged, banned = self.judged_workers()
        peers = []
        for peer, seen in sorted(self.peers.items(), key=lambda kv: (kv[1].roles, kv[0])):
            row = {"peer": peer, "roles": list(seen.roles), "holds": seen.holds, "fetching": seen.fetching,
                   "heard_s_ago": round(now - seen.last_heard, 1) if seen.last_heard else None}
            if seen.progress:
                row["progress"] = seen.progress
            if seen.groups:
                row["groups"] = seen.groups
                row["claimed_mean_reward"] = round(seen.claimed_sum / seen.claimed_n, 3) if seen.claimed_n else None
            if peer in judged:
                row["judged"] = judged[peer]
            if peer in banned:
                row["banned"] = True
            if seen.votes_accept or seen.votes_reject:
                row["votes"] = {"accept": seen.votes_accept, "reject": seen.votes_reject}
            peers.append(row)
        newest = max(self.versions, default=None)
        return {
            "window_s": window_s, "peers": peers, "newest_version": newest,
            "newest_manifest": self.versions[newest].hex() if newest is not None else None,
            "groups_by_version": {str(v): n for v, n in sorted(self.rollout_versions.items())},
            "rollouts_voted": len(self.verdicts),
            "rollouts_with_a_rejecting_vote": sum(not all(v.values()) for v in self.verdicts.values()),
            "rejecting_votes_by_check": dict(sorted(self.rejected_checks.items())),
            "refused_messages": self.refused,
            "throughput": self.throughput(now, window_s),
            "banned_workers": banned,
        }


def _rollout_id(item: object) -> bytes | None:
    """A group's rollout id (computed from its bytes) or an announcement's (carried); None for anything else."""
    rollout_id = getattr(item, "rollout_id", None)
    if callable(rollout_id):
        rollout_id = rollout_id()
    return rollout_id if isinstance(rollout_id, bytes) else None


def _bounded_put(table: dict, key: object, value: object, limit: int) -> None:
    """Insert, forgetting the oldest entries beyond `limit` (dicts keep insertion order)."""
    table[key] = value
    while len(table) > limit:
        del table[next(iter(table))]


_PROGRESS_ORDER = ("step", "reward", "stage", "answered", "groups_sent", "checked", "accepted", "rejected")


def _ordered(progress: tuple[tuple[str, object], ...]) -> dict:
    """A peer's progress fields, the known ones first in a reading order."""
    rank = {k: i for i, k in enumerate(_PROGRESS_ORDER)}
    return dict(sorted(progress, key=lambda kv: (rank.get(kv[0], len(rank)), kv[0])))


def to_json(report: dict) -> str:
    """The report as strict JSON: a number that is not finite (a mean of huge claimed rewards overflows) becomes
    null, so the output always parses."""
    return json.dumps(_finite(report), allow_nan=False)


def _finite(value: object) -> object:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {str(k): _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    if isinstance(value, bytes):
        return value.hex()
    return value


def render(report: dict) -> str:
    """The report as a few lines for a terminal."""
    lines = [f"{len(report['peers'])} peers heard in {report['window_s']:g} s; newest policy "
             f"{'none' if report['newest_version'] is None else 'v' + str(report['newest_version'])}"]
    manifest = report.get("manifest")
    if report["newest_version"] is not None and not manifest:
        lines.append(f"  no peer holding v{report['newest_version']} answered with its manifest")
    elif manifest and "mib" not in manifest:
        lines.append(f"  v{manifest['version']}: manifest {manifest['signature']}")
    elif manifest:
        lines.append(f"  v{manifest['version']}: {manifest['mib']} MiB, stage {manifest['stage']} (group size "
                     f"{manifest['group_size']}, {manifest['max_new_tokens']} new tokens, temperature "
                     f"{manifest['temperature']:g}), task {manifest['task']}, {manifest['validators']} "
                     f"validator{'' if manifest['validators'] == 1 else 's'}, "
                     f"quorum {manifest['quorum']} of {manifest['replicas']}, {manifest['signature']}")
    for row in report["peers"]:
        held = ",".join(f"v{v}" for v in row["holds"]) or "nothing"
        text = f"  {row['peer']}  {'+'.join(row['roles']) or '(no heartbeat)'}: holds {held}"
        if row["fetching"]:
            text += f", fetching {','.join(f'v{v}' for v in row['fetching'])}"
        if row.get("progress"):
            text += "; " + ", ".join(f"{k} {v}" for k, v in row["progress"].items())
        if "groups" in row:
            text += (f"; {row['groups']} groups heard from it here (claimed mean reward "
                     f"{row['claimed_mean_reward']})")
        if "votes" in row:
            text += f"; voted {row['votes']['accept']} accept / {row['votes']['reject']} reject"
        if "judged" in row:
            text += f"; its rollouts {row['judged']['accepted']} accepted / {row['judged']['rejected']} rejected"
        if row.get("banned"):
            text += " (BANNED by the votes heard)"
        lines.append(text)
    if report["rollouts_voted"]:
        lines.append(f"  votes on {report['rollouts_voted']} rollouts, {report['rollouts_with_a_rejecting_vote']} "
                     f"with a rejecting vote" + (f" (failed checks: {report['rejecting_votes_by_check']})"
                                                 if report["rejecting_votes_by_check"] else ""))
    rates = report.get("throughput")
    if rates:
        lines.append(f"  throughput over the last {rates['over_s']:g} s: {rates['groups_per_min']:g} groups/min, "
                     f"{rates['votes_per_min']:g} votes/min")
    if report["refused_messages"]:
        lines.append(f"  {report['refused_messages']} messages refused (malformed, or signed by someone else)")
    return "\n".join(lines)
