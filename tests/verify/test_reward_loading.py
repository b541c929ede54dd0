"""A run's own reward function: loading it by name, its code hash, the checks on what it returns, and the built-in
scorers called through the same reward_funcs interface."""

from __future__ import annotations

import blake3
import pytest

from verify.reward_fns import BUILTIN_REWARDS, resolve, score_direct
from verify.reward_loading import RewardError, call_reward, code_hash, is_custom_reward, load_reward
from verify.rewards import compute_rewards

SOURCE = ("def score(completions, answer, **_):\n"
          "    return [float(c.strip() == a) for c, a in zip(completions, answer)]\n")


def reward_file(tmp_path, source: str = SOURCE, name: str = "my_reward.py"):
    path = tmp_path / name
    path.write_text(source)
    return path


def test_a_file_reward_loads_with_the_blake3_of_its_source_and_scores_in_the_reward_funcs_shape(tmp_path):
    path = reward_file(tmp_path)
    loaded = load_reward(f"{path}:score")
    assert loaded.code_hash == blake3.blake3(SOURCE.encode()).hexdigest() == code_hash(f"{path}:score")
    assert call_reward(loaded.fn, loaded.name, ["7", " 8 "], {"answer": "8", "prompt": "?"}) == [0.0, 1.0]


def test_an_installed_module_reward_hashes_its_module_file():
    loaded = load_reward("verify.reward_fns:reward_exact")
    import verify.reward_fns

    with open(verify.reward_fns.__file__, "rb") as source:
        assert loaded.code_hash == blake3.blake3(source.read()).hexdigest()


@pytest.mark.parametrize("name,problem", [
    ("no_colon_here", "is not of the form module:function or path/to/file.py:function"),
    ("bad name:score", "is not of the form module:function"),
    ("module:", "is not of the form module:function"),
    ("nosuch_module_xyz:score", "reward module 'nosuch_module_xyz' is not installed"),
    ("missing/file.py:score", "reward file missing/file.py does not exist"),
    ("verify.reward_fns:no_such_function", "reward module verify.reward_fns has no function 'no_such_function'"),
    ("verify.reward_fns:REGISTRY", "reward verify.reward_fns:REGISTRY is a dict, not a function"),
])
def test_a_reward_that_cannot_be_loaded_is_one_sentence_naming_why(name, problem):
    with pytest.raises(RewardError) as caught:
        load_reward(name)
    assert problem in str(caught.value) and "\n" not in str(caught.value)


def test_a_reward_file_that_raises_while_loading_names_the_file_and_the_error(tmp_path):
    path = reward_file(tmp_path, "raise RuntimeError('no GPU here')\n", "broken.py")
    with pytest.raises(RewardError, match=r"reward file .*broken.py failed to run: RuntimeError: no GPU here"):
        load_reward(f"{path}:score")


def test_a_reward_whose_bytes_differ_from_the_runs_hash_is_refused_before_it_runs(tmp_path):
    path = reward_file(tmp_path, "raise SystemExit('ran')\n", "other.py")
    expected = "ab" * 32
    with pytest.raises(RewardError) as caught:
        load_reward(f"{path}:score", expected_hash=expected)
    found = blake3.blake3(path.read_bytes()).hexdigest()
    assert f"should hash {expected[:16]}... but this peer's copy hashes {found[:16]}..." in str(caught.value)


@pytest.mark.parametrize("returned,problem", [
    ("0.5", "returned a float, not a list of floats"),
    ("[1.0]", "returned 1 values for 2 completions"),
    ("['1', '0']", "returned a str among its values, not a float"),
    ("[True, False]", "returned a bool among its values, not a float"),
])
def test_a_reward_that_returns_the_wrong_length_or_type_is_one_sentence(tmp_path, returned, problem):
    path = reward_file(tmp_path, f"def score(completions, **_):\n    return {returned}\n", f"r{abs(hash(returned))}.py")
    loaded = load_reward(f"{path}:score")
    with pytest.raises(RewardError, match=problem):
        call_reward(loaded.fn, loaded.name, ["a", "b"], {"answer": "a"})


def test_built_in_scorers_are_reward_funcs_and_custom_names_are_told_apart():
    assert BUILTIN_REWARDS["exact"](["Answer: 4", "Answer: 5"], answer=["4", "4"]) == [1.0, 0.0]
    assert resolve("exact") is BUILTIN_REWARDS["exact"]
    assert is_custom_reward("pkg.mod:fn") and is_custom_reward("a/b.py:fn")
    assert not is_custom_reward("rg:gcd") and not is_custom_reward("exact")


def test_a_custom_reward_scores_through_compute_rewards_and_a_failing_one_scores_zero(tmp_path):
    good = reward_file(tmp_path, "def score(completions, answer, **_):\n    return [0.25 for _ in completions]\n",
                       "quarter.py")
    broken = reward_file(tmp_path, "def score(completions, **_):\n    return None\n", "none.py")
    entry = {"prompt": "?", "answer": "1", "metadata": {}}
    assert compute_rewards(f"{good}:score", ["x", "y"], entry) == [0.25, 0.25]
    assert compute_rewards(f"{broken}:score", ["x"], entry) == [0.0]
    assert score_direct("not_a_reward", "x", entry) == 0.0


def test_a_trl_reward_function_gets_the_prompts_under_trls_name(tmp_path):
    source = ("def longer(prompts, completions, **kwargs):\n"
              "    return [float(len(c) > len(p)) for p, c in zip(prompts, completions)]\n")
    path = reward_file(tmp_path, source, "trl.py")
    loaded = load_reward(f"{path}:longer")
    assert call_reward(loaded.fn, loaded.name, ["ab", "abcdef"], {"prompt": "abc", "answer": "x"}) == [0.0, 1.0]
