"""`swarm bench verify`: rollout validation on honest and attacked groups (see swarm/bench/verify_harness.py).

Prints one JSON report: per case groups, rejected, gen_s, proof_build_s, validate_s, which checks rejected, and a
summary with false rejects, attacks caught in fewer than 99% of groups (and why), and time shares of generation.
Its "history" section (swarm/bench/verify_history.py) holds the honest near-tie rates and, per attack class judged by a
worker's history, groups tried, rejected, workers banned and after how many groups, and what the history costs.

The default sizes keep a run to a few minutes on two cores (200 honest groups, 20 attempts per class), which shows
every class and the costs but cannot show the issue's targets (`targets_met` stays false). The full section,
>= 2,000 honest groups and >= 100 attempts per class (14-31 minutes on two cores), is
`swarm bench verify --json --history only --honest-groups 2000 --per-worker 100 --attempts 100`.
"""

from __future__ import annotations

import argparse
import dataclasses
import json

from swarm.errors import UserError, require_at_least_one


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print the JSON report only (no progress line)")
    parser.add_argument("--model", default="tiny", help="tiny | smollm2 | a local HF model directory (default tiny)")
    parser.add_argument("--groups", type=int, default=20, help="groups per case (default 20)")
    parser.add_argument("--group-size", type=int, default=4, help="completions per group (default 4)")
    parser.add_argument("--max-new-tokens", type=int, default=64, help="generation limit per completion (default 64)")
    parser.add_argument("--temperature", type=float, default=0.8, help="sampling temperature (default 0.8)")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads (default 1)")
    parser.add_argument("--min-eos-prob", type=float, default=None,
                        help="termination rule's P(EOS) floor (default 0.1; 0.0 for the random-init tiny model)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the task set and attacks (default 0)")
    parser.add_argument("--honest-only", action="store_true", dest="honest_only",
                        help="run only the honest cases (generation, proof and validation cost; no attacks)")
    parser.add_argument("--history", choices=("on", "off", "only"), default="on",
                        help="the worker-history section: honest near-tie rates, false bans, and the attacks judged "
                             "per worker (int8 decoding reproved, near-tie steering) or per group (another "
                             "temperature or group size honestly labelled, near-duplicates); 'only' skips the "
                             "other cases (default on; never with --honest-only)")
    parser.add_argument("--honest-groups", type=int, default=200, dest="honest_groups",
                        help="honest groups of the history section (default 200; 2000 shows the false-ban target)")
    parser.add_argument("--per-worker", type=int, default=20, dest="per_worker",
                        help="honest groups per honest worker in the history section (default 20; 100 for the "
                             "long-lived workers of the full section)")
    parser.add_argument("--attempts", type=int, default=20,
                        help="attacking workers (or single groups) per history class (default 20; 100 shows the "
                             "99 %% target)")
    parser.add_argument("--precision", choices=("float32", "bfloat16"), default="float32",
                        help="what workers generate in (bfloat16: as vLLM on GPUs, checked with that "
                             "precision's tolerances by float32 validators; default float32)")
    parser.add_argument("--crowd", choices=("on", "off", "only"), default="off",
                        help="the crowd section: the share of training that fresh attacking identities per version "
                             "buy, with lying validators among six (swarm/bench/verify_crowd.py); 'only' skips the "
                             "cases and the history section (default off)")
    parser.add_argument("--crowd-pool", type=int, default=40, dest="crowd_pool",
                        help="real groups generated and validated per class for the crowd section (default 40)")
    parser.add_argument("--crowd-identities", default="1,10,100", dest="crowd_identities",
                        help="fresh attacking identities per version, comma-separated (default 1,10,100)")


def run(args: argparse.Namespace) -> int:
    from swarm.bench.verify_crowd import pools, run_crowd
    from swarm.bench.verify_harness import BenchConfig, run_cases
    from swarm.bench.verify_history import HistoryBenchConfig, run_history

    require_at_least_one(groups=args.groups, group_size=args.group_size, max_new_tokens=args.max_new_tokens,
                         threads=args.threads, honest_groups=args.honest_groups, per_worker=args.per_worker,
                         attempts=args.attempts, crowd_pool=args.crowd_pool)
    config = BenchConfig(model=args.model, groups=args.groups, group_size=args.group_size,
                         max_new_tokens=args.max_new_tokens, temperature=args.temperature, threads=args.threads,
                         seed=args.seed, min_eos_prob=args.min_eos_prob, honest_only=args.honest_only,
                         precision=args.precision, history=args.history, honest_groups=args.honest_groups,
                         per_worker=args.per_worker, attempts=args.attempts)
    crowd = _crowd_config(args)
    if args.crowd == "only":
        config = dataclasses.replace(config, history="only")
    harness, report = run_cases(config)
    if not config.honest_only and config.history != "off" and args.crowd != "only":
        report["history"] = run_history(harness, HistoryBenchConfig(
            honest_groups=config.honest_groups, per_worker=config.per_worker, attempts=config.attempts))
    if args.crowd != "off" and not config.honest_only:
        report["crowd"] = run_crowd(pools(harness, crowd), crowd)
    print(json.dumps(report, indent=None if args.json else 2))
    return 0


def _crowd_config(args: argparse.Namespace):
    """The crowd section's grid from the command line (identities: positive integers, comma-separated)."""
    from swarm.bench.verify_crowd import CrowdConfig

    try:
        identities = tuple(int(x) for x in args.crowd_identities.split(","))
    except ValueError:
        identities = ()
    if not identities or min(identities) < 1:
        raise UserError(f"--crowd-identities must be positive integers separated by commas, got "
                        f"{args.crowd_identities!r}")
    return CrowdConfig(pool_groups=args.crowd_pool, identities=identities, seed=args.seed)
