"""The reward scorer process: `python -m verify.scorer_worker`, driven by verify.rewards over stdin/stdout.

Why a plain subprocess rather than multiprocessing: spawn and forkserver re-import the parent's __main__ module,
which breaks (or re-runs) scripts without a main guard and stdin-fed programs; this child imports only what it
needs. Frames: parent -> child a 4-byte big-endian length then a pickle of (reward_fn, [completion, ...], entry),
built by the parent from its own data; child -> parent one 8-byte big-endian double per completion, in order. The
child writes one ready byte first.
"""

from __future__ import annotations

import pickle
import struct
import sys


def _read_exact(stream, n: int) -> bytes | None:
    data = b""
    while len(data) < n:
        chunk = stream.read(n - len(data))
        if not chunk:
            return None
        data += chunk
    return data


def main() -> None:
    import math_verify  # noqa: F401 - imported before signalling ready, so no request pays for it
    import reasoning_gym  # noqa: F401

    from verify.rewards import _score_direct

    _score_direct("math", "\\boxed{1}", {"answer": "1"})  # warm math-verify's lazy grammar up before ready
    out, inp = sys.stdout.buffer, sys.stdin.buffer
    out.write(b"R")
    out.flush()
    while True:
        header = _read_exact(inp, 4)
        if header is None:
            return
        body = _read_exact(inp, struct.unpack(">I", header)[0])
        if body is None:
            return
        try:
            reward_fn, completions, entry = pickle.loads(body)
        except Exception:  # noqa: BLE001 - cannot happen with our own parent; end rather than guess a count
            return
        out.write(b"".join(struct.pack(">d", _score_one(_score_direct, reward_fn, c, entry)) for c in completions))
        out.flush()


def _score_one(score, reward_fn: str, completion: str, entry: dict) -> float:
    try:
        return float(score(reward_fn, completion, entry))
    except Exception:  # noqa: BLE001 - any scorer failure is a wrong answer
        return 0.0


if __name__ == "__main__":
    main()
