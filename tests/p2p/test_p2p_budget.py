"""The node-wide budget of unverified input: leases grow and shrink, growth past the limit is refused and changes
nothing, each lease's first FREE_BYTES are free, and freed memory is handed back after enough was given back."""

import pytest

from p2p.budget import FREE_BYTES, TRIM_AFTER, BudgetExhausted, ByteRate, MemoryBudget


def test_leases_share_one_limit_and_a_refused_growth_changes_nothing():
    trims = []
    budget = MemoryBudget(1000, trim=lambda: trims.append(1))
    a, b = budget.lease("a"), budget.lease("b")
    a.resize(FREE_BYTES + 600)
    with pytest.raises(BudgetExhausted, match="b of 500 more bytes refused"):
        b.resize(FREE_BYTES + 500)
    assert (budget.held, b.size, budget.refused) == (600, 0, 1)
    b.resize(FREE_BYTES + 400)
    assert budget.held == budget.limit == budget.peak
    with a:
        pass
    assert budget.held == 400 and a.size == 0
    b.resize(FREE_BYTES)  # control traffic: free
    assert budget.held == 0 and not trims


def test_freed_memory_is_handed_back_once_per_trim_after_bytes():
    trims = []
    budget = MemoryBudget(4 * TRIM_AFTER, trim=lambda: trims.append(1))
    lease = budget.lease("x")
    for _ in range(3):
        lease.resize(FREE_BYTES + TRIM_AFTER // 2)
        lease.close()
    assert len(trims) == 1


def test_a_byte_rate_queues_readers_then_refuses_past_its_wait_taking_nothing():
    rate = ByteRate(rate=100, burst=200, max_wait=1.0)
    assert rate.reserve(200, "a", now=0.0) == 0.0  # the burst
    assert rate.reserve(100, "b", now=0.0) == pytest.approx(1.0)  # queued behind it
    with pytest.raises(BudgetExhausted):
        rate.reserve(1, "c", now=0.0)
    assert rate.refused == 1
    assert rate.reserve(100, "d", now=1.0) == pytest.approx(1.0)  # the refusal took nothing
    rate.give_back(100, now=1.0)  # "d" ended early
    assert rate.reserve(50, "e", now=3.0) == 0.0


def test_a_byte_rate_starts_full_on_a_clock_that_went_back():
    rate = ByteRate(rate=1, burst=10, max_wait=0.0)
    rate.reserve(10, "a", now=50.0)
    assert rate.reserve(10, "b", now=0.0) == 0.0  # another trio run's clock
