"""A link's outbox on a virtual clock: a `have` waits up to the lazy delay for company, and leaves at once with any
message that may not wait, or with the next piece."""

from __future__ import annotations

import trio

from p2p.pieces.engine import SendPiece
from p2p.pieces.outbox import Outbox
from p2p.pieces.wire import Have, Request


async def test_lazy_messages_wait_for_their_delay_and_leave_together(autojump_clock):
    box = Outbox(lazy_delay=0.02)
    box.put_lazy(Have(1))

    async def later():
        await trio.sleep(0.005)
        box.put_lazy(Have(2))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(later)
        assert await box.take() == ([Have(1), Have(2)], None)
    assert trio.current_time() == 0.02  # the first one's delay, not the second's


async def test_a_message_that_may_not_wait_takes_the_waiting_ones_along_at_once(autojump_clock):
    box = Outbox(lazy_delay=0.02)
    box.put_lazy(Have(1))

    async def later():
        await trio.sleep(0.005)
        box.put_control(Request(3))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(later)
        assert await box.take() == ([Have(1), Request(3)], None)
    assert trio.current_time() == 0.005


async def test_a_queued_piece_goes_first_and_the_waiting_haves_leave_in_its_send(autojump_clock):
    box = Outbox(lazy_delay=0.02)
    box.put_lazy(Have(1))
    box.put_piece(SendPiece("p", 4))
    assert await box.take() == ([], SendPiece("p", 4))
    assert box.take_control() == [Have(1)]  # the sender puts them in the piece's own send
    assert trio.current_time() == 0 and len(box) == 0
    with trio.move_on_after(1) as scope:
        await box.take()
    assert scope.cancelled_caught  # nothing left: the sender parks, no delay pending


async def test_no_lazy_delay_sends_a_have_at_once(autojump_clock):
    box = Outbox()
    box.put_lazy(Have(1))
    assert await box.take() == ([Have(1)], None)
    assert trio.current_time() == 0
