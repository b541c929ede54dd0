"""`swarm bench generate`: tokens/s of the torch backend with and without TOPLOC proof capture.

Why interleaved repeats and CPU time: on a shared CPU the machine's load drifts and wall time mostly measures the
neighbours; alternating the two settings, keeping the best of each, and comparing the process's CPU time (with
one torch thread, CPU time is the work done) isolates what proof capture adds. The overhead is also split into
the part spent building proofs (verify.toploc) and the rest (the LM-head hook and hidden-state buffers).
"""

from __future__ import annotations

import argparse
import json
import time
from typing import TYPE_CHECKING

from swarm.errors import UserError, require_at_least_one, require_temperature
from tasks import load_tasks

if TYPE_CHECKING:
    import torch

    from inference.backend import GenerationRequest
    from inference.torch_backend import TorchBackend


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default="tiny", help="'tiny', 'smollm2' or a local model directory")
    parser.add_argument("--task", default="basic_arithmetic", help="reasoning-gym task the prompts come from")
    parser.add_argument("--prompts", type=int, default=8, help="distinct prompts per generate call")
    parser.add_argument("--group-size", type=int, default=4, help="completions per prompt")
    parser.add_argument("--max-new-tokens", type=int, default=64, help="generation limit per completion")
    parser.add_argument("--temperature", type=float, default=1.0, help="sampling temperature")
    parser.add_argument("--repeats", type=int, default=3, help="timed runs per setting (best is kept)")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (1 makes CPU time comparable)")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of a summary line")


def run(args: argparse.Namespace) -> int:
    require_at_least_one(prompts=args.prompts, group_size=args.group_size, max_new_tokens=args.max_new_tokens,
                         repeats=args.repeats)
    require_temperature(args.temperature)
    if args.threads < 0:
        raise UserError(f"--threads must be 0 (torch's default) or more, got {args.threads}")

    import torch

    from inference.models import load_model
    from inference.rollouts import make_request
    from inference.torch_backend import TorchBackend
    from verify.toploc import build_proofs

    if args.threads:
        torch.set_num_threads(args.threads)
    started = time.perf_counter()
    loaded = load_model(args.model)
    load_s = time.perf_counter() - started
    build_time = [0.0]

    def timed_proofs(hiddens: list[torch.Tensor]) -> list[bytes]:
        t0 = time.perf_counter()
        proofs = build_proofs(hiddens)
        build_time[0] += time.perf_counter() - t0
        return proofs

    backend = TorchBackend(loaded, proof_fn=timed_proofs)
    tasks = load_tasks(args.task, size=args.prompts, seed=0)
    requests = [make_request(loaded.tokenizer, e, run="bench", worker="bench", step=0, group_size=args.group_size,
                             temperature=args.temperature, max_new_tokens=args.max_new_tokens) for e in tasks]
    report = measure(backend, requests, args.repeats, build_time)
    report.update(model=args.model, load_s=round(load_s, 2), prompts=args.prompts, group_size=args.group_size,
                  max_new_tokens=args.max_new_tokens, threads=torch.get_num_threads(), repeats=args.repeats)
    if args.json:
        print(json.dumps(report))
    else:
        print(f"{args.model}: {report['tokens_per_s_without_proofs']} tok/s without proofs, "
              f"{report['tokens_per_s_with_proofs']} with (CPU-time overhead {report['proof_overhead_pct']}%)")
    return 0


def measure(backend: TorchBackend, requests: list[GenerationRequest], repeats: int, build_time: list[float]) -> dict:
    """Best-of-`repeats` wall time of the same requests with proof capture off and on, interleaved."""
    backend.capture_proofs = False
    results = backend.generate(requests)  # warm-up (allocator, lazy imports)
    tokens = sum(len(c.tokens) for g in results for c in g.completions)
    wall = {False: float("inf"), True: float("inf")}
    cpu = {False: float("inf"), True: float("inf")}
    build_best = float("inf")
    for _ in range(repeats):
        for capture in (False, True):
            backend.capture_proofs = capture
            build_time[0] = 0.0
            w0, c0 = time.perf_counter(), time.process_time()
            out = backend.generate(requests)
            w1, c1 = time.perf_counter(), time.process_time()
            assert sum(len(c.tokens) for g in out for c in g.completions) == tokens  # same work both ways
            wall[capture], cpu[capture] = min(wall[capture], w1 - w0), min(cpu[capture], c1 - c0)
            if capture:
                build_best = min(build_best, build_time[0])
    return {
        "tokens": tokens,
        "wall_s_without_proofs": round(wall[False], 4),
        "wall_s_with_proofs": round(wall[True], 4),
        "cpu_s_without_proofs": round(cpu[False], 4),
        "cpu_s_with_proofs": round(cpu[True], 4),
        "tokens_per_s_without_proofs": round(tokens / wall[False], 1),
        "tokens_per_s_with_proofs": round(tokens / wall[True], 1),
        "proof_overhead_pct": round(100 * (cpu[True] - cpu[False]) / cpu[False], 2),
        "proof_overhead_wall_pct": round(100 * (wall[True] - wall[False]) / wall[False], 2),
        "proof_build_s": round(build_best, 4),
        "proof_build_pct": round(100 * build_best / cpu[False], 2),
    }
