"""inference.rollouts and solve_rate: wire rollouts with claimed rewards, and cached offline difficulty filtering."""

import pytest

from inference.rollouts import build_rollout_group, make_request
from inference.solve_rate import solve_rate_estimator
from inference.torch_backend import TorchBackend
from tasks import DifficultyBand, decode_completion, filter_by_solve_rate, load_tasks
from verify.rewards import compute_reward
from verify.rollout import RolloutGroup

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_rollout_group_round_trips_with_claimed_rewards(tiny):
    backend = TorchBackend(tiny)
    entry = load_tasks("basic_arithmetic", size=4, seed=2)[3]
    request = make_request(tiny.tokenizer, entry, run="r1", worker="peer-a", step=7, group_size=3, temperature=0.8,
                           max_new_tokens=10)
    group = build_rollout_group(backend.generate([request])[0], entry, tiny.tokenizer, run="r1", worker="peer-a",
                                step=7)
    assert (group.run, group.worker, group.step, group.task_index, group.dataset) == ("r1", "peer-a", 7, 3,
                                                                                     "basic_arithmetic")
    assert group.prompt_tokens == request.prompt_tokens and len(group.completions) == 3
    for c in group.completions:
        text = decode_completion(tiny.tokenizer, c.tokens)
        assert c.reward == compute_reward(entry.reward_fn, text, entry.to_dict())
    assert RolloutGroup.decode(group.encode()) == group


def test_a_group_sampled_under_other_keys_is_refused(tiny):
    backend = TorchBackend(tiny)
    entry = load_tasks("basic_arithmetic", size=2, seed=2)[1]
    request = make_request(tiny.tokenizer, entry, run="r1", worker="peer-a", step=7, group_size=2, temperature=1.0,
                           max_new_tokens=4)
    result = backend.generate([request])[0]
    with pytest.raises(ValueError, match="keys that do not match"):
        build_rollout_group(result, entry, tiny.tokenizer, run="r1", worker="peer-b", step=7)


class CountingBackend:
    """The real torch backend, counting how many prompts it was asked to complete."""

    def __init__(self, inner):
        self.inner, self.prompts = inner, 0

    def generate(self, requests):
        self.prompts += len(requests)
        return self.inner.generate(requests)


def test_difficulty_filter_over_the_backend_is_cached(tmp_path, tiny):
    backend = CountingBackend(TorchBackend(tiny))
    tasks = load_tasks("chain_sum", size=6, seed=0)
    estimate = solve_rate_estimator(backend, tiny.tokenizer, samples=2, temperature=1.0, max_new_tokens=4)
    cache = tmp_path / "rates.json"
    everything = filter_by_solve_rate(tasks, estimate, model_id=tiny.model_id, samples=2, cache_path=cache,
                                      band=DifficultyBand(0.0, 1.0))
    assert len(everything) == 6 and backend.prompts == 6
    # A random model solves nothing, so the INTELLECT-2 band [0.1, 0.8] keeps nothing; no regeneration happens.
    kept = filter_by_solve_rate(tasks, estimate, model_id=tiny.model_id, samples=2, cache_path=cache)
    assert len(kept) == 0 and backend.prompts == 6


def test_a_rollout_of_empty_arrays_is_refused_before_it_inflates():
    """An empty array is one byte on the wire and a Python list in memory: an 8 KiB compressed body of them would
    inflate into 586 MiB of lists if decoded before the schema is checked."""
    import tracemalloc

    from verify.rollout import RolloutSchemaError

    count = 4 << 20
    bomb = b"\xdd" + count.to_bytes(4, "big") + b"\x90" * count
    tracemalloc.start()
    try:
        with pytest.raises(RolloutSchemaError, match="maps and arrays"):
            RolloutGroup.decode(bomb)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 16 << 20
