"""Freezing a long-running process's start-up objects: when it happens, what it keeps, what it leaves alone."""

from __future__ import annotations

import gc
import weakref

import pytest
import trio

from swarm.errors import UserError
from swarm.node.gc_warmup import run_freezing_after_warmup


class Node:
    """A container object the collector tracks."""

    def __init__(self) -> None:
        self.other: Node | None = None


def tracked(obj: object) -> bool:
    """Whether a collection would walk `obj` (frozen objects sit in a generation no collection visits)."""
    return any(o is obj for o in gc.get_objects())


async def test_survivors_are_frozen_at_the_given_times_after_garbage_is_collected(autojump_clock):
    kept = Node()
    cycle = Node()
    cycle.other, cycle.other_back = Node(), cycle  # garbage only a collection can free
    cycle.other.other = cycle
    gone = weakref.ref(cycle)
    del cycle
    seen = {}

    async def work() -> str:
        await trio.sleep(4)
        seen["before"] = (tracked(kept), gone() is not None)
        await trio.sleep(2)  # t = 6: the first freeze (t = 5) has happened
        seen["after"] = (tracked(kept), gone() is not None)
        late = Node()
        await trio.sleep(15)  # t = 21: the second freeze (t = 20) took what was made since
        seen["late"] = tracked(late)
        return "done"

    try:
        assert await run_freezing_after_warmup(work, times_s=(20.0, 5.0)) == "done"
    finally:
        gc.unfreeze()  # give the test process its collector back
    assert seen["before"] == (True, True)  # nothing frozen or collected early
    assert seen["after"] == (False, False)  # the survivor frozen, the garbage freed rather than frozen
    assert seen["late"] is False


async def test_what_the_work_raises_reaches_the_caller_as_raised():
    async def fail() -> None:
        await trio.sleep(0)
        raise UserError("the run name is taken")

    with pytest.raises(UserError, match="the run name is taken"):  # not wrapped in an exception group
        await run_freezing_after_warmup(fail, times_s=(3600.0,))
