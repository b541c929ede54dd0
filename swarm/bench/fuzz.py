"""`swarm bench fuzz`: every decoder of network input under random mutations of valid encodings, for N seconds.

Prints one JSON report: inputs tried per target and every failure (target, exception type, message, reproducer
bytes as hex); exits 1 when there is any. The targets and the property are those of swarm.bench.fuzz_targets (the same
table the test suite fuzzes with hypothesis); here inputs are drawn from a seeded `random.Random`, without
shrinking, so a long run before a release covers far more inputs than the suite's bounded examples.
"""

from __future__ import annotations

import argparse
import json
import random
import time

from swarm.bench.fuzz_mutations import mutate, splice
from swarm.errors import UserError

MAX_FAILURES_PER_TARGET = 20
"""Failures kept per target; one per (exception type, message start) so one bug does not fill the report."""
BATCH = 16
"""Inputs per target between clock reads and target switches."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--seconds", type=float, default=10.0, help="total run time over all targets (default 10)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the mutations (default 0)")
    parser.add_argument("--target", action="append", default=[], metavar="NAME",
                        help="fuzz only this target (repeatable; default: every target)")
    parser.add_argument("--json", action="store_true", help="print the JSON report on one line")


def run(args: argparse.Namespace) -> int:
    from swarm.bench.fuzz_targets import BY_NAME, TARGETS

    unknown = [name for name in args.target if name not in BY_NAME]
    if unknown:
        raise UserError(f"unknown fuzz target {unknown[0]!r}; choose from {', '.join(BY_NAME)}")
    if not args.seconds > 0:
        raise UserError(f"--seconds must be positive, got {args.seconds}")
    targets = [BY_NAME[name] for name in args.target] or list(TARGETS)
    report = fuzz(targets, args.seconds, args.seed)
    print(json.dumps(report, indent=None if args.json else 2))
    return 1 if report["failures"] else 0


def fuzz(targets: list, seconds: float, seed: int, max_inputs: int | None = None) -> dict:
    """Round-robin over `targets` in batches until `seconds` of wall time have passed (a benchmark, so wall time)
    or `max_inputs` inputs were tried."""
    from swarm.bench.fuzz_targets import failure_of

    rng = random.Random(seed)
    for target in targets:  # samples built and modules imported before the clock starts: every target gets turns
        for sample in target.samples():
            failure_of(target, sample)
    tried = {target.name: 0 for target in targets}
    failures: list[dict] = []
    seen: set[tuple[str, str, str]] = set()
    start = time.monotonic()
    while time.monotonic() - start < seconds and (max_inputs is None or sum(tried.values()) < max_inputs):
        for target in targets:
            samples = target.samples()
            for _ in range(BATCH):
                if rng.random() < 0.9:
                    data = mutate(rng.choice(samples), rng, prefix=target.frame_prefix)
                else:
                    data = splice(rng.choice(samples), rng.choice(samples), rng)
                tried[target.name] += 1
                failure = failure_of(target, data)
                if failure is not None:
                    _keep(failure, failures, seen)
            if time.monotonic() - start >= seconds:
                break
    elapsed = time.monotonic() - start
    return {"seconds": round(elapsed, 2), "seed": seed, "inputs": sum(tried.values()), "inputs_per_target": tried,
            "failures": failures}


def _keep(failure: dict, failures: list[dict], seen: set) -> None:
    key = (failure["target"], failure["type"], failure["message"][:40])
    if key in seen or sum(f["target"] == failure["target"] for f in failures) >= MAX_FAILURES_PER_TARGET:
        return
    seen.add(key)
    failures.append(failure)
