"""`swarm bench churn --departures`: which peers may leave for good without ending the run."""

from swarm.bench.churn import _may_leave


def roles(validators: int, workers: int, seeds: int) -> dict[str, list[str]]:
    names = [f"validator{i}" for i in range(validators)] + [f"worker{i}" for i in range(workers)]
    return {name: [] for name in names + [f"seed{i}" for i in range(seeds)]}


def test_a_departure_keeps_a_quorum_of_validators_and_one_inference_peer():
    assert _may_leave(roles(3, 2, 1), quorum=2) == ["validator0", "validator1", "validator2", "worker0", "worker1",
                                                    "seed0"]
    assert _may_leave(roles(2, 1, 1), quorum=2) == ["seed0"]  # no validator above the quorum, the only worker
    assert _may_leave(roles(2, 1, 0), quorum=2) == []  # nobody: that kill restarts its peer instead
    assert _may_leave(roles(2, 2, 0), quorum=1) == ["validator0", "validator1", "worker0", "worker1"]
