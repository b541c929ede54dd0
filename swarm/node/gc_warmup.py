"""Keep what a long-running process built while starting up out of the garbage collector's full collections.

Why: a CPython full (oldest-generation) collection walks every container object the process holds. A peer that
imported torch, transformers and py-libp2p and built its model holds over half a million of them, almost all
living as long as the process (modules, functions, classes, the model's layers). Measured in `swarm sim`, whose
peers share one process: a full collection every ~6 s, each stalling the one trio loop for ~240 ms, 5.7 % of the
loop after start-up. `gc.freeze()` moves every object alive at that moment to a permanent generation that
collections skip; later collections walk only what was made since (10-18 ms each in the same simulation).

Why twice and never again: an object frozen while alive that later becomes part of a reference cycle with nothing
else pointing at it is never reclaimed (plain reference counting still frees everything else). Freezing at a few
fixed points bounds that to what was alive then, which is mostly start-up state; the second point catches the
modules imported lazily when the first real work arrives (reward functions, tokenizers). Each freeze costs one full
collection first, so start-up garbage is freed rather than frozen.
"""

from __future__ import annotations

import gc
from collections.abc import Awaitable, Callable, Sequence
from typing import TypeVar

import trio

FREEZE_AFTER_S = (10.0, 120.0)
"""Seconds of trio time after the start at which survivors are frozen."""

T = TypeVar("T")


def freeze_survivors() -> int:
    """Collect once, then freeze everything still alive; returns how many objects are frozen in all."""
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()


async def _freeze_at(times_s: Sequence[float]) -> None:
    start = trio.current_time()
    for at in sorted(times_s):
        await trio.sleep_until(start + at)
        freeze_survivors()


async def run_freezing_after_warmup(async_fn: Callable[..., Awaitable[T]], *args,
                                    times_s: Sequence[float] = FREEZE_AFTER_S) -> T:
    """`await async_fn(*args)` as the run's main work, freezing survivors at `times_s` meanwhile.

    The freezer is a trio system task: it ends with the run, and it adds no nursery around `async_fn`, so what the
    work raises reaches the caller as it was raised (no exception group).
    """
    trio.lowlevel.spawn_system_task(_freeze_at, times_s)
    return await async_fn(*args)
