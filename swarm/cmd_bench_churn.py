"""`swarm bench churn`: a run that keeps training while its other peers are killed and come back.

A trainer (with a seed role), validators, inference peers and seed-only peers run as separate `swarm peer start`
processes on loopback, on the tiny model. Every `--kill-every` seconds one peer other than the trainer, picked by a
seeded draw, is killed with SIGKILL (no goodbye, as a machine that loses power) and restarted on its own data
directory. What a user lending machines cares about is printed as one JSON object: how many steps the trainer took
overall and between kills, whether any role failed, and whether any process printed a traceback. Peers that come
back must find the run again (bootstrap redial, heartbeats), resume their piece stores, and be re-assigned work.
"""

from __future__ import annotations

import argparse
import json
import random
import signal
import tempfile
import time
from pathlib import Path

from swarm.errors import UserError

TRAINER_TOML = """\
model = "tiny"
task = "gcd"
task_config = {max_value = 50}
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
checkpoint_every = 1000
threads = 1
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--seconds", type=float, default=300.0, help="how long the run is churned")
    parser.add_argument("--kill-every", dest="kill_every", type=float, default=25.0,
                        help="seconds between two kills (each kill restarts the peer at once); 0: no kills, the "
                             "baseline to compare steps per minute with")
    parser.add_argument("--validators", type=int, default=2)
    parser.add_argument("--inference", type=int, default=2)
    parser.add_argument("--seeds", type=int, default=1, help="seed-only peers")
    parser.add_argument("--seed", dest="draw_seed", type=int, default=1, help="seed of the draw of whom to kill")
    parser.add_argument("--work-dir", dest="work_dir", type=Path, help="keep data and logs here (default: a temp dir)")
    parser.add_argument("--json", action="store_true", help="print only the JSON result")


def run(args: argparse.Namespace) -> int:
    if args.seconds <= 0 or not 0 <= args.kill_every <= args.seconds:
        raise UserError(f"--kill-every must be 0 (no kills) up to --seconds ({args.seconds:g}), and --seconds above "
                        f"0; got {args.kill_every:g} and {args.seconds:g}")
    if args.validators < 1 or args.inference < 1 or args.seeds < 0:
        raise UserError("a churned run needs at least one validator and one inference peer")
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
    from swarm.bench_broadcast import EventProcess

    key = Identity.generate()
    write_key_file(work / "run.key", key)
    (work / "trainer.toml").write_text(TRAINER_TOML)
    replicas = min(2, args.validators)
    started: dict[str, int] = {}
    procs: dict[str, EventProcess] = {}
    retired: list[EventProcess] = []

    def start(name: str, *flags: str) -> EventProcess:
        started[name] = started.get(name, 0) + 1
        argv = ["-m", "swarm", "peer", "start", "--json-events", "--run", "churn", "--listen", "/ip4/127.0.0.1/tcp/0",
                "--data-dir", str(work / name), *flags]
        return EventProcess(argv, work / f"{name}.{started[name]}.log")

    roles = {f"validator{i}": ["--role", "validator", "--model", "tiny"] for i in range(args.validators)}
    roles |= {f"worker{i}": ["--role", "inference", "--model", "tiny"] for i in range(args.inference)}
    roles |= {f"seed{i}": ["--role", "seed"] for i in range(args.seeds)}
    kills = []
    try:
        procs["trainer"] = start("trainer", "--role", "trainer", "--role", "seed", "--trainer-config",
                                 str(work / "trainer.toml"), "--key", str(work / "run.key"), "--replicas",
                                 str(replicas), "--quorum", "1", "--prompts-per-worker", "2")
        address = procs["trainer"].wait_for("listening", time.monotonic() + 120)["addrs"][0]
        joined = ["--bootstrap", address, "--trainer-key", key.public_bytes.hex()]
        for name, flags in roles.items():
            procs[name] = start(name, *flags, *joined)
        procs["trainer"].wait_for("train_step", time.monotonic() + 300)  # churn a run that works, from its first step
        draw, begin = random.Random(args.draw_seed), time.monotonic()
        steps_at_start = _steps(procs["trainer"])
        while args.kill_every and time.monotonic() - begin + args.kill_every <= args.seconds:
            time.sleep(args.kill_every)
            victim = draw.choice(sorted(roles))
            procs[victim].popen.send_signal(signal.SIGKILL)
            procs[victim].popen.wait()
            retired.append(procs[victim])
            procs[victim] = start(victim, *roles[victim], *joined)
            kills.append({"t_s": round(time.monotonic() - begin, 1), "killed": victim, "trainer_steps": _steps(procs["trainer"])})
        time.sleep(max(0.0, args.seconds - (time.monotonic() - begin)))
        steps = _steps(procs["trainer"]) - steps_at_start
        elapsed = time.monotonic() - begin
    finally:
        for proc in [*procs.values(), *retired]:
            proc.stop()
    everyone = [*procs.values(), *retired]
    gaps = [b["trainer_steps"] - a["trainer_steps"] for a, b in zip(kills, kills[1:])]
    return {
        "seconds": round(elapsed, 1), "kills": len(kills), "kill_every_s": args.kill_every,
        "peers": {"validators": args.validators, "inference": args.inference, "seeds": args.seeds},
        "trainer_steps": steps, "steps_per_min": round(60 * steps / elapsed, 1),
        "fewest_steps_between_kills": min(gaps, default=None),
        "role_failures": sum(len(p.events("role_failed")) for p in everyone),
        "logs_with_traceback": sum("Traceback" in Path(p.log.name).read_text(errors="replace") for p in everyone),
        "kill_log": kills,
    }


def _steps(trainer) -> int:
    return len(trainer.events("train_step"))


def _summary(r: dict) -> str:
    return (f"{r['trainer_steps']} trainer steps in {r['seconds']} s ({r['steps_per_min']}/min) with {r['kills']} "
            f"kills, one every {r['kill_every_s']:g} s (fewest steps between two kills: {r['fewest_steps_between_kills']}); "
            f"role failures {r['role_failures']}, logs with a traceback {r['logs_with_traceback']}")
