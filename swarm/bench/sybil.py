"""`swarm bench sybil --identities N --json`: what N fresh identities cost a target peer, one attack kind at a time.

Identities are free, so every bound a node keeps must hold for any number of them. Per kind the bench starts fresh
`swarm peer start` processes on 127.0.0.1 (the target, and where the kind needs them a relay, honest peers and a
publisher), runs the attack from the bench's own process with N fresh Ed25519 identities, and reports one JSON
object with one row per kind:

- target_cpu_share: the target's CPU seconds per wall second over the attack (one core is 1.0; /proc), up to its
  last sample if it died (target_died_after_s says when); the gossip kinds measure at least 10 s from the attack's
  start and 2 s past a longer one (swarm.bench.sybil_gossip.MIN_WINDOW_S), and report target_cpu_s, the CPU
  seconds themselves, which do not depend on the window;
- target_rss_above_baseline_mib: its largest resident memory during the attack above the one before it;
- honest_completion_s: {"with": ..., "without": ...} where honest peers have work to finish (else null);
- forwarded: attackers' messages an honest witness received through the target (gossip kinds);
- bans: peers the target banned during the attack (its metrics);
- third_party_connections: connections a listener the bench owns received (hole punches; else null);
- peer_died: whether any peer the bench started exited during the attack;
- reservation_after_s, honest_circuit_after_crowd_s: seconds until an honest private peer holds a reservation on the
  relay once the attackers left, and an honest circuit through it once their circuits closed (relay; null: never);
- targets: each pass/fail below, and `pass` when all hold.

The kinds (swarm/bench/sybil_*.py): gossip-flood, rollout-bombs, link-squatting, relay, hole-punch. The machine is
shared with whatever else runs on it, the attackers included: CPU figures are noisy.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import trio

from swarm.bench.sybil_gossip import gossip_flood, rollout_bombs
from swarm.bench.sybil_links import run_link_squatting
from swarm.bench.sybil_measure import fresh_identities, start_peer
from swarm.bench.sybil_punch import run_hole_punches
from swarm.bench.sybil_relay import relay_reservations
from swarm.errors import UserError

RUN = "bench-sybil"
CPU_SHARE_MAX = 0.10
RSS_ABOVE_MAX_MIB = 150.0
HONEST_SLOWDOWN_MAX = 3.0
THIRD_PARTY_PER_IDENTITY_MAX = 3.0
RESERVATION_WITHIN_S = 5.0


def _single_target(attack: Callable, *flags: str) -> Callable[[Path, int, argparse.Namespace], dict]:
    """A kind whose target is one seed peer (started with `flags`) and whose attack runs against it alone."""

    def run_kind(work: Path, n: int, args: argparse.Namespace) -> dict:
        target = start_peer(work, "target", RUN, *flags)
        try:
            return trio.run(attack, target, RUN, fresh_identities(n), args)
        finally:
            target.proc.stop()

    return run_kind


KINDS: dict[str, Callable[[Path, int, argparse.Namespace], dict]] = {
    "gossip-flood": _single_target(gossip_flood),
    "rollout-bombs": _single_target(rollout_bombs),
    "link-squatting": lambda work, n, args: run_link_squatting(work, RUN, n, args),
    "relay": _single_target(relay_reservations, "--set", "reach.mode=public"),
    "hole-punch": lambda work, n, args: run_hole_punches(work, RUN, n, args),
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--identities", type=int, default=32, help="fresh attacker identities per kind")
    parser.add_argument("--kinds", default=",".join(KINDS), help="attack kinds, comma-separated")
    parser.add_argument("--seconds", type=float, default=40.0,
                        help="longest attack of each kind, in seconds (link squatting: the honest peers have 3x this "
                             "to finish)")
    parser.add_argument("--rate", type=float, default=200.0, help="messages a second each gossip attacker sends")
    parser.add_argument("--per-identity-s", dest="per_identity_s", type=float, default=10.0,
                        help="longest a gossip attacker goes on before the next identity takes its place")
    parser.add_argument("--parallel", type=int, default=4,
                        help="attackers attacking at once (gossip, reservations; hole punches: at least a quarter "
                             "of them)")
    parser.add_argument("--reservation-wait-s", dest="reservation_wait_s", type=float, default=15.0,
                        help="longest the honest private peer asks the relay for a reservation")
    parser.add_argument("--crowd-ips", dest="crowd_ips", choices=("many", "one"), default="many",
                        help="relay kind: each attacker and honest peer connects from a loopback address of its own "
                             "(many), or all from 127.0.0.1 (one: the relay's per-IP caps lump them together)")
    parser.add_argument("--squat-mb", dest="squat_mb", type=float, default=8.0,
                        help="size of the policy the honest peers fetch in the link-squatting runs, MiB")
    parser.add_argument("--squat-mbps", dest="squat_mbps", type=float, default=64.0,
                        help="upload cap of the publisher and honest peers in the link-squatting runs, Mbit/s")
    parser.add_argument("--punch-relay", dest="punch_relay", choices=("bench", "peer"), default="bench",
                        help="hole-punch kind's relay: the bench's own with room for every circuit, or a peer's")
    parser.add_argument("--work-dir", dest="work_dir", type=Path, help="keep the peers' files here (default: temp)")
    parser.add_argument("--json", action="store_true", help="print one JSON object (the only output form)")


def targets(row: dict, n: int) -> dict[str, bool]:
    """The pass/fail of each target that applies to the row."""
    cpu = row.get("target_cpu_share")
    checks = {"no_peer_died": not row["peer_died"], "cpu_under_10pct": cpu is not None and cpu < CPU_SHARE_MAX,
              "rss_under_150mib": row["target_rss_above_baseline_mib"] < RSS_ABOVE_MAX_MIB}
    honest = row.get("honest_completion_s")
    if honest is not None:
        checks["honest_within_3x"] = (honest["with"] is not None and honest["without"] is not None
                                      and honest["with"] <= HONEST_SLOWDOWN_MAX * honest["without"])
    if row.get("third_party_connections") is not None:
        used = row.get("identities_used", n)  # those the time limit let attack
        checks["third_party_few_per_identity"] = row["third_party_connections"] <= THIRD_PARTY_PER_IDENTITY_MAX * used
    if "reservation_after_s" in row:
        waited = row["reservation_after_s"]
        checks["reservation_within_seconds"] = waited is not None and waited <= RESERVATION_WITHIN_S
    if "honest_circuit_after_crowd_s" in row:
        checks["honest_circuit_after_crowd"] = row["honest_circuit_after_crowd_s"] is not None
    return checks


def finish_row(kind: str, n: int, row: dict) -> dict:
    """The row with the keys every kind reports (null where one does not apply) and its targets."""
    full = {"kind": kind, "identities": n, "honest_completion_s": None, "forwarded": None, "bans": None,
            "third_party_connections": None, **row}
    full["targets"] = targets(full, n)
    full["pass"] = all(full["targets"].values())
    return full


def _kinds(text: str) -> list[str]:
    chosen = [k.strip() for k in text.split(",") if k.strip()]
    unknown = [k for k in chosen if k not in KINDS]
    if unknown or not chosen:
        raise UserError(f"unknown attack kinds {unknown}; choose from {', '.join(KINDS)}")
    return chosen


def run(args: argparse.Namespace) -> int:
    kinds = _kinds(args.kinds)
    positive = (args.seconds, args.rate, args.per_identity_s, args.reservation_wait_s, args.squat_mb, args.squat_mbps)
    if args.identities < 1 or args.parallel < 1 or min(positive) <= 0:
        raise UserError("--identities and --parallel must be at least 1; --seconds, --rate, --per-identity-s, "
                        "--reservation-wait-s, --squat-mb and --squat-mbps positive")
    rows = []
    with tempfile.TemporaryDirectory(prefix="swarm-bench-sybil-") as tmp:
        for kind in kinds:
            base = args.work_dir or Path(tmp)
            base.mkdir(parents=True, exist_ok=True)
            work = Path(tempfile.mkdtemp(prefix=f"{kind}-", dir=base))  # a kept --work-dir is never reused
            rows.append(finish_row(kind, args.identities, KINDS[kind](work, args.identities, args)))
            print(json.dumps(rows[-1]), file=sys.stderr, flush=True)  # each kind as it is measured
    print(json.dumps({"identities": args.identities, "kinds": rows, "pass": all(r["pass"] for r in rows)}))
    return 0
