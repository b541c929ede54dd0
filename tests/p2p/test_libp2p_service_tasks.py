"""py-libp2p's service manager finds the parent of each task it starts by an index (p2p.libp2p_compat
.index_service_tasks), and finds the same parent its own walk over the service's tasks would."""

from __future__ import annotations

import trio
from libp2p.tools.anyio_service import Service, background_trio_service
from libp2p.tools.anyio_service.trio_tasks import FunctionTask

from p2p.libp2p_compat import index_service_tasks


def walked_parent(manager, trio_task):
    """What py-libp2p's own `_find_parent_task` returns: the first task of the tree running `trio_task`."""
    for task in FunctionTask.iterate_tasks(*manager._root_tasks):
        if task.has_trio_task and task.trio_task is trio_task:
            return task
    return None


class Nested(Service):
    """Tasks that start tasks, three levels deep, each checking the parent the manager finds for it."""

    def __init__(self) -> None:
        self.checked: list[bool] = []
        self.found: list[object] = []
        self.done = trio.Event()
        self.other = None  # another service's manager: it must not claim this service's tasks

    async def run(self) -> None:
        self.manager.run_task(self.level, 0)
        self.manager.run_daemon_task(self.idle)
        await self.done.wait()

    async def idle(self) -> None:
        await trio.sleep_forever()

    async def level(self, depth: int) -> None:
        here = trio.lowlevel.current_task()
        found = self.manager._find_parent_task(here)
        self.checked.append(found is walked_parent(self.manager, here)
                            and (self.other is None or self.other._find_parent_task(here) is None))
        self.found.append(found)
        if depth < 3:
            for _ in range(2):
                self.manager.run_task(self.level, depth + 1)
            await trio.sleep(0.1)
        if len(self.checked) == 15:
            self.done.set()


async def test_the_indexed_parent_is_the_one_the_walk_finds():
    index_service_tasks()
    index_service_tasks()  # a second call changes nothing
    service, other = Nested(), Nested()
    with trio.fail_after(10):
        async with background_trio_service(other) as other_manager, background_trio_service(service) as manager:
            service.other = other_manager
            await service.done.wait()
            outside = manager._find_parent_task(trio.lowlevel.current_task())  # not one of the service's tasks
            await manager.stop()
    assert service.checked == [True] * 15 and all(isinstance(task, FunctionTask) for task in service.found)
    assert outside is None
