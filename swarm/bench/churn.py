"""`swarm bench churn`: a run that keeps training while its peers are killed and come back.

A trainer (with a seed role), validators, inference peers and seed-only peers run as separate `swarm peer start`
processes on loopback, on the tiny model. Every `--kill-every` seconds one peer other than the trainer, picked by a
seeded draw, is killed with SIGKILL (no goodbye, as a machine that loses power) and restarted on its own data
directory; with `--kill-trainer-every N` every Nth kill is the trainer's, which comes back on its own address and
resumes from its last checkpoint (taken every 5 steps), so the steps since are lost and taken again; with
`--departures N` the first N kills are departures for good (the peer never comes back, as a lender who leaves),
drawn so that a quorum of validators and one inference peer remain. What a user lending machines cares about is
printed as one JSON object: how far the trainer got overall and between kills, how long a killed trainer took to
step again, whether any role failed, and whether any process printed a traceback.
Peers that come back must find the run again (bootstrap redial, heartbeats), resume their piece stores, and be
re-assigned work.
"""

from __future__ import annotations

import argparse
import json
import random
import signal
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING

from swarm.bench.local_ports import free_port
from swarm.errors import UserError

if TYPE_CHECKING:
    from swarm.bench.broadcast import EventProcess

TRAINER_TOML = """\
model = "tiny"
task = "gcd"
task_config = {{max_value = 50}}
task_size = 200
curriculum = "none"
steps = 1000000
steps_per_policy = 1
prompts_per_step = 4
group_size = 8
max_new_tokens = 6
temperature = 1.0
lr = 1e-3
eval_every = 0
checkpoint_every = {checkpoint_every}
async_level = {async_level}
threads = 1
"""


TRAINER_CHECKPOINT_EVERY = 5
"""Steps between the trainer's checkpoints when it is churned too (otherwise 1000: the steps-per-minute figures
leave checkpoint writes out)."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--seconds", type=float, default=300.0, help="how long the run is churned")
    parser.add_argument("--kill-every", dest="kill_every", type=float, default=25.0,
                        help="seconds between two kills (each kill restarts the peer at once); 0: no kills, the "
                             "baseline to compare steps per minute with")
    parser.add_argument("--kill-trainer-every", dest="kill_trainer_every", type=int, default=0,
                        help="make every Nth kill the trainer's (it resumes from its checkpoint, taken every "
                             f"{TRAINER_CHECKPOINT_EVERY} steps); 0: the trainer is never killed")
    parser.add_argument("--departures", type=int, default=0,
                        help="the first N kills are of peers that never come back (never the trainer; at least "
                             "--quorum validators and one inference peer stay)")
    parser.add_argument("--replicas", type=int, help="validators assigned to each rollout (default: min(2, "
                                                     "--validators))")
    parser.add_argument("--quorum", type=int, default=1, help="accepting votes a rollout needs (default 1)")
    parser.add_argument("--async-level", dest="async_level", type=int, default=0,
                        help="the trainer's async window (default 0: synchronous)")
    parser.add_argument("--validators", type=int, default=2)
    parser.add_argument("--inference", type=int, default=2)
    parser.add_argument("--seed-peers", dest="seeds", type=int, default=1, help="seed-only peers")
    parser.add_argument("--seeds", dest="seeds", type=int, default=1, help=argparse.SUPPRESS)
    parser.add_argument("--seed", dest="draw_seed", type=int, default=1, help="seed of the draw of whom to kill")
    parser.add_argument("--work-dir", dest="work_dir", type=Path, help="keep data and logs here (default: a temp dir)")
    parser.add_argument("--json", action="store_true", help="print only the JSON result")


def run(args: argparse.Namespace) -> int:
    if args.seconds <= 0 or not 0 <= args.kill_every <= args.seconds:
        raise UserError(f"--kill-every must be 0 (no kills) up to --seconds ({args.seconds:g}), and --seconds above "
                        f"0; got {args.kill_every:g} and {args.seconds:g}")
    if args.kill_trainer_every < 0:
        raise UserError(f"--kill-trainer-every must be 0 (never) or more; got {args.kill_trainer_every}")
    if args.validators < 1 or args.inference < 1 or args.seeds < 0:
        raise UserError("a churned run needs at least one validator and one inference peer")
    args.replicas = min(2, args.validators) if args.replicas is None else args.replicas
    if not 1 <= args.quorum <= args.replicas <= args.validators:
        raise UserError(f"need 1 <= --quorum ({args.quorum}) <= --replicas ({args.replicas}) <= --validators "
                        f"({args.validators})")
    if args.async_level < 0:
        raise UserError(f"--async-level must be 0 or more; got {args.async_level}")
    if args.departures < 0:
        raise UserError(f"--departures must be 0 or more; got {args.departures}")
    if args.work_dir is not None:
        args.work_dir.mkdir(parents=True, exist_ok=True)
        result = churn(args, args.work_dir)
    else:
        with tempfile.TemporaryDirectory(prefix="swarm-churn-") as tmp:
            result = churn(args, Path(tmp))
    print(json.dumps(result) if args.json else _summary(result))
    return 0 if result["role_failures"] == 0 and result["logs_with_traceback"] == 0 else 1


def churn(args: argparse.Namespace, work: Path) -> dict:
    from p2p.identity import Identity, write_key_file
    from swarm.bench.broadcast import EventProcess

    key = Identity.generate()
    write_key_file(work / "run.key", key)
    every = TRAINER_CHECKPOINT_EVERY if args.kill_trainer_every else 1000
    (work / "trainer.toml").write_text(TRAINER_TOML.format(checkpoint_every=every, async_level=args.async_level))
    started: dict[str, int] = {}
    procs: dict[str, EventProcess] = {}
    retired: list[EventProcess] = []

    def start(name: str, *flags: str, listen: str = "/ip4/127.0.0.1/tcp/0") -> EventProcess:
        started[name] = started.get(name, 0) + 1
        argv = ["-m", "swarm", "peer", "start", "--json", "--run", "churn", "--listen", listen,
                "--data-dir", str(work / name), *flags]
        return EventProcess(argv, work / f"{name}.{started[name]}.log")

    # The trainer keeps one address, as a machine that reboots does: every other peer bootstraps from it.
    trainer = ["--role", "trainer", "--role", "seed", "--trainer-config", str(work / "trainer.toml"), "--identity-key",
               str(work / "run.key"), "--replicas", str(args.replicas), "--quorum", str(args.quorum),
               "--prompts-per-worker", "2"]
    trainer_listen = f"/ip4/127.0.0.1/tcp/{free_port()}"
    roles = {f"validator{i}": ["--role", "validator", "--model", "tiny"] for i in range(args.validators)}
    roles |= {f"worker{i}": ["--role", "inference", "--model", "tiny"] for i in range(args.inference)}
    roles |= {f"seed{i}": ["--role", "seed"] for i in range(args.seeds)}
    kills: list[dict] = []
    trainers: list[EventProcess] = []  # every trainer process, first to last
    try:
        procs["trainer"] = start("trainer", *trainer, listen=trainer_listen)
        trainers.append(procs["trainer"])
        address = procs["trainer"].wait_for("listening", time.monotonic() + 120)["addrs"][0]
        joined = ["--bootstrap", address, "--trainer-key", key.public_bytes.hex()]
        for name, flags in roles.items():
            procs[name] = start(name, *flags, *joined)
        procs["trainer"].wait_for("train_step", time.monotonic() + 300)  # churn a run that works, from its first step
        draw, begin = random.Random(args.draw_seed), time.monotonic()
        first_step = _last_step([procs["trainer"]])
        while args.kill_every and time.monotonic() - begin + args.kill_every <= args.seconds:
            time.sleep(args.kill_every)
            victim, leaving = _pick_victim(draw, roles, len(kills), args)
            at_step = _last_step(trainers)
            procs[victim].popen.send_signal(signal.SIGKILL)
            procs[victim].popen.wait()
            killed_at = time.monotonic()
            retired.append(procs[victim])
            if leaving:
                del procs[victim], roles[victim]
            elif victim == "trainer":
                procs[victim] = start(victim, *trainer, listen=trainer_listen)
                trainers.append(procs[victim])
            else:
                procs[victim] = start(victim, *roles[victim], *joined)
            kills.append({"t_s": round(killed_at - begin, 1), "killed": victim, "trainer_step": at_step,
                          "left": leaving, "at": killed_at, "process": procs.get(victim)})
        time.sleep(max(0.0, args.seconds - (time.monotonic() - begin)))
        elapsed = time.monotonic() - begin
    finally:
        for proc in [*procs.values(), *retired]:
            proc.stop()
    everyone = [*procs.values(), *retired]
    progress = _last_step(trainers) - first_step
    taken = sum(1 for p in trainers for e in p.events("train_step") if e["t"] > begin)
    gaps = [b["trainer_step"] - a["trainer_step"] for a, b in zip(kills, kills[1:])]
    return {
        "seconds": round(elapsed, 1), "kills": len(kills), "kill_every_s": args.kill_every,
        "trainer_kills": sum(k["killed"] == "trainer" for k in kills),
        "departures": sum(k["left"] for k in kills),
        "peers": {"validators": args.validators, "inference": args.inference, "seeds": args.seeds},
        "replicas": args.replicas, "quorum": args.quorum, "async_level": args.async_level,
        "trainer_steps": progress, "steps_per_min": round(60 * progress / elapsed, 1),
        "steps_taken_again": taken - progress,
        "trainer_recovery_s": [_recovery(k) for k in kills if k["killed"] == "trainer"],
        "fewest_steps_between_kills": min(gaps, default=None),
        "role_failures": sum(len(p.events("role_failed")) for p in everyone),
        "logs_with_traceback": sum("Traceback" in Path(p.log.name).read_text(errors="replace") for p in everyone),
        "kill_log": [{k: v for k, v in kill.items() if k not in ("at", "process")} for kill in kills],
    }


def _pick_victim(draw: random.Random, roles: dict[str, list[str]], done: int,
                 args: argparse.Namespace) -> tuple[str, bool]:
    """(who the next kill hits, whether it leaves for good) after `done` kills: the first --departures take a peer
    that may leave, every --kill-trainer-every-th restart hits the trainer, the rest a drawn peer."""
    may_leave = _may_leave(roles, args.quorum) if done < args.departures else []
    leaving = bool(may_leave)  # with none that may leave, this kill is a restart like the others
    victim = draw.choice(sorted(may_leave or roles))
    if args.kill_trainer_every and (done + 1) % args.kill_trainer_every == 0 and not leaving:
        victim = "trainer"
    return victim, leaving


def _may_leave(roles: dict[str, list[str]], quorum: int) -> list[str]:
    """The peers one may take away for good: any whose role keeps a quorum of validators and one inference peer."""
    validators = [name for name in roles if name.startswith("validator")]
    workers = [name for name in roles if name.startswith("worker")]
    seeds = [name for name in roles if name.startswith("seed")]
    return (validators if len(validators) > quorum else []) + (workers if len(workers) > 1 else []) + seeds


def _last_step(trainers: list[EventProcess]) -> int:
    """The newest step any of these trainer processes reported (0 before the first)."""
    return max((e["step"] for p in trainers for e in p.events("train_step")), default=0)


def _recovery(kill: dict) -> float | None:
    """Seconds from the trainer's kill to the restarted trainer's first step (None: it took none)."""
    steps = kill["process"].events("train_step")
    return round(steps[0]["t"] - kill["at"], 1) if steps else None


def _summary(r: dict) -> str:
    trainer = "" if not r["trainer_kills"] else (
        f"; the trainer was killed {r['trainer_kills']} times, took its first step again after "
        f"{r['trainer_recovery_s']} s and took {r['steps_taken_again']} steps again")
    left = f" ({r['departures']} of them for good)" if r["departures"] else ""
    return (f"{r['trainer_steps']} trainer steps in {r['seconds']} s ({r['steps_per_min']}/min) with {r['kills']} "
            f"kills{left}, one every {r['kill_every_s']:g} s (fewest steps between two kills: "
            f"{r['fewest_steps_between_kills']})"
            f"{trainer}; "
            f"role failures {r['role_failures']}, logs with a traceback {r['logs_with_traceback']}")
