"""`swarm bench noise`: the cost of drawing the seeded Gumbel noise, per element, against its textbook form.

Why a benchmark of its own: every decoding step of every worker and every position a validator re-derives draws a
[rows, vocab] block of this noise, so its cost per element bounds the sampler on large vocabularies. The textbook
form (whole-array numpy, verify.testing) is timed in the same process, interleaved, so the ratio holds on a noisy
machine; both give the same values up to one float32 ulp of the log.
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np

from swarm.errors import UserError, require_at_least_one


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--rows", type=int, default=64, help="rows per draw (decoding batch or positions; default 64)")
    parser.add_argument("--vocab", type=int, default=49152, help="vocabulary size (default 49152, SmolLM2's)")
    parser.add_argument("--repeats", type=int, default=5, help="timed draws per form, interleaved (best is kept)")
    parser.add_argument("--device", default="cpu", help="where the draw is made: cpu or cuda (default cpu)")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (default 1)")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of a summary line")


def run(args: argparse.Namespace) -> int:
    import torch

    from verify.sampling import gumbel_noise_at
    from verify.testing import textbook_gumbel_noise

    require_at_least_one(rows=args.rows, vocab=args.vocab, repeats=args.repeats)
    if args.device not in ("cpu", "cuda") or (args.device == "cuda" and not torch.cuda.is_available()):
        raise UserError(f"device {args.device!r} is not available here (cpu, or cuda where torch sees a GPU)")
    torch.set_num_threads(args.threads)
    seeds = np.arange(1, args.rows + 1, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15)
    positions = np.arange(args.rows) % 4096
    device = torch.device(args.device)

    def draw() -> torch.Tensor:
        noise = gumbel_noise_at(seeds, positions, args.vocab, device)
        if device.type == "cuda":
            torch.cuda.synchronize()
        return noise

    forms = {"draw": draw, "textbook": lambda: textbook_gumbel_noise(seeds, positions, args.vocab)}
    best = {name: float("inf") for name in forms}
    for _ in range(args.repeats):
        for name, form in forms.items():
            started = time.perf_counter()
            form()
            best[name] = min(best[name], time.perf_counter() - started)
    deviation = float((draw().cpu() - forms["textbook"]()).abs().max())
    elements = args.rows * args.vocab
    report = {"rows": args.rows, "vocab": args.vocab, "device": args.device, "threads": torch.get_num_threads(),
              "repeats": args.repeats, "draw_s": round(best["draw"], 5), "textbook_s": round(best["textbook"], 5),
              "ns_per_element": round(best["draw"] / elements * 1e9, 2),
              "textbook_ns_per_element": round(best["textbook"] / elements * 1e9, 2),
              "speedup": round(best["textbook"] / best["draw"], 2), "max_abs_difference": deviation}
    if args.json:
        print(json.dumps(report))
    else:
        print(f"noise [{args.rows} x {args.vocab}] on {args.device}: {report['ns_per_element']} ns/element, "
              f"textbook {report['textbook_ns_per_element']} ({report['speedup']}x)")
    return 0
