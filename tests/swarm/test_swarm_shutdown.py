"""Bounded shutdown: a peer whose network close hangs still ends, and the process guard ends what trio cannot."""

from __future__ import annotations

import logging
from contextlib import asynccontextmanager

import trio

import p2p.gossip.service
import swarm.node.node as node_module
from p2p.identity import Identity
from swarm.shutdown import ExitGuard
from tests.swarm.test_swarm_nodes import Peer


def test_a_peer_whose_gossip_never_finishes_closing_still_returns(tmp_path, monkeypatch, caplog):
    real_open_gossip = p2p.gossip.service.open_gossip

    @asynccontextmanager
    async def hanging_gossip(*args, **kwargs):
        async with real_open_gossip(*args, **kwargs) as gossip:
            yield gossip
            await trio.sleep_forever()  # a close that waits for ever (cancellable: the grace period ends it)

    monkeypatch.setattr(node_module, "open_gossip", hanging_gossip)
    monkeypatch.setattr(node_module, "TEARDOWN_GRACE_S", 0.5)
    peer = Peer(tmp_path, "a", Identity.generate())
    stopping: list = []

    async def main():
        async def stop_once_running(node):
            node.done.set()

        with trio.fail_after(30):
            return await node_module.open_node_parts(peer.config, peer.identity, _quiet_sink(),
                                                     [stop_once_running], peer.trainer.public_bytes,
                                                     stopping.append)

    with caplog.at_level(logging.WARNING, logger="swarm.node.node"):
        assert trio.run(main) == 0
    assert len(stopping) == 1 and stopping[0].done.is_set()
    assert "closing the network took over" in caplog.text
    # halfway through the grace period it said where the close waits
    assert "still closing the network" in caplog.text
    assert "hanging_gossip (tests/swarm/test_swarm_shutdown.py" in caplog.text


def _quiet_sink():
    from swarm.events import EventSink

    return EventSink(json_lines=False, stream=open("/dev/null", "w"))


def test_the_guard_finishes_the_work_and_exits_with_the_armed_status():
    done, exits = [], []
    guard = ExitGuard(45.0, before_exit=lambda: done.append("report"), exit_process=exits.append)
    guard.arm(3)
    guard.expire()  # what the timer thread calls when the process outlives the bound
    assert done == ["report"] and exits == [3]
    guard.disarm()


def test_a_disarmed_guard_does_nothing():
    done, exits = [], []
    guard = ExitGuard(45.0, before_exit=lambda: done.append("report"), exit_process=exits.append)
    guard.arm(0)
    guard.disarm()  # the normal exit came first
    guard.expire()
    assert done == [] and exits == []
    assert not guard._timer.is_alive() or guard._timer.finished.is_set()


def test_ctrl_c_in_a_commands_trio_run_is_bounded_like_sigterm():
    """Ctrl-C arms the same guard as SIGTERM: an unwind held by a shielded close still ends, with status 130 and
    the interrupted line, and the handler trio installed is back in place once the run ends."""
    import os
    import signal

    import pytest

    from swarm.shutdown import Interrupts, run_trio

    exits: list[int] = []
    released = trio.Event()

    async def held_by_a_shielded_close():
        token = trio.lowlevel.current_trio_token()
        interrupts.exit_process = lambda status: (exits.append(status), token.run_sync_soon(released.set))
        try:
            os.kill(os.getpid(), signal.SIGINT)
            await trio.sleep_forever()
        finally:
            with trio.move_on_after(5) as scope:  # without the guard this is where the process would sit
                scope.shield = True
                await released.wait()

    interrupts = Interrupts(grace_s=0.05)
    with interrupts.installed(), pytest.raises(KeyboardInterrupt):
        run_trio(held_by_a_shielded_close)
    assert exits == [130] and interrupts.line() == "swarm: interrupted"
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
