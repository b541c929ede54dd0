"""What a run's swarm looks like from the outside: the status view behind `swarm status`, as a pure aggregator.

Why: whoever starts a run, or lends GPUs to one, needs to see it: which peers are there and in which roles, which
policy versions they hold, whether workers are sending rollouts and validators voting, and what they reject. Every
peer already gossips all of that (heartbeats, rollouts, votes), so an observer only has to listen for a while.
`SwarmView` takes those messages as plain data (the network is `swarm.cli.status`'s business) and summarises them.
Rollout rewards are the workers' claims, unverified; only votes (each signature checked, each from its own voter)
say what validators accepted.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field

from swarm.messages.gossip_bodies import Heartbeat


@dataclass
class PeerSeen:
    roles: tuple[str, ...] = ()
    holds: list[int] = field(default_factory=list)  # complete policy versions
    fetching: list[int] = field(default_factory=list)
    last_heard: float = 0.0
    groups: int = 0  # rollout groups sent in the window
    claimed_rewards: list[float] = field(default_factory=list)
    votes_accept: int = 0
    votes_reject: int = 0
    progress: dict = field(default_factory=dict)  # what its roles did (swarm.node.node.Node.note_progress)
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
    verdicts: dict[bytes, list[bool]] = field(default_factory=dict)  # rollout id -> votes seen
    refused: int = 0  # messages refused here (rollouts of another worker, votes not signed by their sender)

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

    def on_rollouts(self, sender: str, items: list) -> None:
        """Parsed items of one rollout message (groups, announcements, refusals: swarm.messages.rollout_codec)."""
        seen = self._peer(sender)
        for item in items:
            version, worker = getattr(item, "policy_version", None), getattr(item, "worker", None)
            if not isinstance(version, int) or worker != sender:
                self.refused += 1
                continue
            seen.groups += 1
            self.rollout_versions[version] = self.rollout_versions.get(version, 0) + 1
            completions = getattr(item, "completions", ())
            seen.claimed_rewards += [float(c.reward) for c in completions]

    def on_votes(self, sender: str, votes: list, voter_of) -> None:
        """Votes of one message; `voter_of(vote)` is the voter's peer id when its signature checks out, else None."""
        for vote in votes:
            if voter_of(vote) != sender:
                self.refused += 1
                continue
            seen = self._peer(sender)
            if vote.accept:
                seen.votes_accept += 1
            else:
                seen.votes_reject += 1
                for name, passed, _reason in vote.checks:
                    if not passed:
                        self.rejected_checks[name] = self.rejected_checks.get(name, 0) + 1
            self.verdicts.setdefault(vote.rollout_id, []).append(bool(vote.accept))

    def report(self, now: float, window_s: float) -> dict:
        peers = []
        for peer, seen in sorted(self.peers.items(), key=lambda kv: (kv[1].roles, kv[0])):
            row = {"peer": peer, "roles": list(seen.roles), "holds": seen.holds, "fetching": seen.fetching,
                   "heard_s_ago": round(now - seen.last_heard, 1) if seen.last_heard else None}
            if seen.progress:
                row["progress"] = seen.progress
            if seen.groups:
                row["groups"] = seen.groups
                row["claimed_mean_reward"] = (round(sum(seen.claimed_rewards) / len(seen.claimed_rewards), 3)
                                              if seen.claimed_rewards else None)
            if seen.votes_accept or seen.votes_reject:
                row["votes"] = {"accept": seen.votes_accept, "reject": seen.votes_reject}
            peers.append(row)
        newest = max(self.versions, default=None)
        return {
            "window_s": window_s, "peers": peers, "newest_version": newest,
            "newest_manifest": self.versions[newest].hex() if newest is not None else None,
            "groups_by_version": {str(v): n for v, n in sorted(self.rollout_versions.items())},
            "rollouts_voted": len(self.verdicts),
            "rollouts_with_a_rejecting_vote": sum(not all(v) for v in self.verdicts.values()),
            "rejecting_votes_by_check": dict(sorted(self.rejected_checks.items())),
            "refused_messages": self.refused,
        }


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
            text += f"; sent {row['groups']} groups (claimed mean reward {row['claimed_mean_reward']})"
        if "votes" in row:
            text += f"; voted {row['votes']['accept']} accept / {row['votes']['reject']} reject"
        lines.append(text)
    if report["rollouts_voted"]:
        lines.append(f"  votes on {report['rollouts_voted']} rollouts, {report['rollouts_with_a_rejecting_vote']} "
                     f"with a rejecting vote" + (f" (failed checks: {report['rejecting_votes_by_check']})"
                                                 if report["rejecting_votes_by_check"] else ""))
    if report["refused_messages"]:
        lines.append(f"  {report['refused_messages']} messages refused (malformed, or signed by someone else)")
    return "\n".join(lines)
