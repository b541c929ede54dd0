"""The inference role across a restart: a worker never answers a slot twice, so a crash never costs it its standing."""

from __future__ import annotations

import dataclasses
import random
from types import SimpleNamespace

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from inference.published import PublishedSlots, PublishedSlotsUnreadable
from inference.torch_backend import TorchBackend
from swarm.policy.runspec import RunSpec, VersionTasks
from swarm.roles.gate import SLOT_TAKEN, RolloutGate
from swarm.roles.inference import _generate, published_slots_path
from tasks import load_tasks
from verify.votes import public_key_of

pytestmark = pytest.mark.usefixtures("one_torch_thread")
PROMPTS = 4


class JitteringBackend:
    """The real torch backend on non-deterministic kernels: each run moves the logprobs by a hair, so a group
    generated again has other bytes. Weights stay the tiny model's (versions only change the manifest id)."""

    def __init__(self, loaded) -> None:
        self.inner, self.prompts, self.rng = TorchBackend(loaded), 0, random.Random(0)

    def load_policy(self, directory: str, *, version: int, manifest_id: bytes, changed=None) -> None:
        self.inner.policy_version, self.inner.manifest_id = version, manifest_id

    @property
    def manifest_id(self) -> bytes:
        return self.inner.manifest_id

    def generate(self, requests):
        self.prompts += len(requests)
        return [dataclasses.replace(r, completions=tuple(
            dataclasses.replace(c, logprobs=tuple(lp - self.rng.uniform(0, 1e-6) for lp in c.logprobs))
            for c in r.completions)) for r in self.inner.generate(requests)]


def worker(tmp_path):
    config = SimpleNamespace(peer=SimpleNamespace(run="run1", data_dir=tmp_path))
    return SimpleNamespace(config=config, peer_id="12D3KooWworker")


def policy(version: int):
    generation = SimpleNamespace(group_size=2, temperature=1.0, max_new_tokens=3)
    return SimpleNamespace(manifest=SimpleNamespace(version=version, id=bytes([version]) * 32, generation=generation))


TASKS = VersionTasks(load_tasks("basic_arithmetic", size=12, seed=0), list(range(12)), PROMPTS)


def answer(node, backend, tiny, version: int, published=None) -> list:
    """One version's pass of the role: what it would publish, with the ledger loaded as a (re)started worker does."""
    published = published if published is not None else PublishedSlots.load(published_slots_path(node.config.peer))
    return _generate(node.config.peer.run, node.peer_id, backend, tiny, policy(version), TASKS, "unused", published,
                     async_level=1)


def gate_for(versions) -> RolloutGate:
    gate = RolloutGate("run1", replicas=2, quorum=2, async_level=1)
    keys = tuple(public_key_of(Ed25519PrivateKey.generate().private_bytes_raw()).hex() for _ in range(2))
    for version in versions:
        gate.specs[version] = RunSpec("basic_arithmetic", 12, "{}", 0, 0.0, "all", PROMPTS, 1, 2, 2, keys)
    gate.newest = max(versions)
    return gate


def test_a_restarted_worker_does_not_answer_again_the_slots_it_published(tmp_path, tiny):
    node, backend = worker(tmp_path), JitteringBackend(tiny)
    gate = gate_for([1])
    first = answer(node, backend, tiny, 1)
    assert len(first) == PROMPTS and all(gate.on_rollout(g, 0.0) == "opened" for g in first)
    assert answer(node, backend, tiny, 1) == [] and backend.prompts == PROMPTS  # restarted: nothing regenerated
    # Without the ledger the same restart resends every slot with other bytes, and the gate bans the worker for it.
    amnesiac = answer(node, backend, tiny, 1, PublishedSlots(tmp_path / "elsewhere.json"))
    assert {g.slot() for g in amnesiac} == {g.slot() for g in first}
    assert not {g.rollout_id() for g in amnesiac} & {g.rollout_id() for g in first}
    refusals = [gate.on_rollout(g, 1.0) for g in amnesiac]
    assert refusals[0] == SLOT_TAKEN and "opened" not in refusals and gate.reputation.is_banned(node.peer_id)


def test_the_published_slots_stay_within_the_async_window(tmp_path, tiny):
    node, backend = worker(tmp_path), JitteringBackend(tiny)
    for version in (1, 2, 3):
        assert len(answer(node, backend, tiny, version)) == PROMPTS
    kept = PublishedSlots.load(published_slots_path(node.config.peer))
    assert len(kept) == 2 * PROMPTS  # versions 2 and 3: version 1 is behind the window and can never be sent again
    assert len(answer(node, backend, tiny, 3)) == 0 and backend.prompts == 3 * PROMPTS


def test_an_unreadable_ledger_stops_the_worker_with_one_sentence_and_is_kept(tmp_path):
    path = tmp_path / "published-slots-run1.json"
    for text in ("not json", '{"v": 1, "slots": {"ab": 1}}', '{"v": 2, "slots": {}}', '[1]',
                 '{"v": 1, "slots": {"' + "a" * 64 + '": -1}}'):
        path.write_text(text)
        with pytest.raises(PublishedSlotsUnreadable, match="is not one this worker wrote; move it away") as caught:
            PublishedSlots.load(path)
        assert "\n" not in str(caught.value) and path.read_text() == text
    assert len(PublishedSlots.load(tmp_path / "none-yet.json")) == 0


def test_the_simulations_cheater_claims_reward_one_for_groups_the_honest_role_built_and_records_them(tmp_path, tiny):
    from swarm.sim.cheater import claim_full_reward

    node, backend = worker(tmp_path), JitteringBackend(tiny)
    published = PublishedSlots.load(published_slots_path(node.config.peer))
    groups = _generate(node.config.peer.run, node.peer_id, backend, tiny, policy(1), TASKS, "unused", published, 1,
                       claim_full_reward)
    assert len(groups) == PROMPTS and all(c.reward == 1.0 for g in groups for c in g.completions)
    honest = answer(node, JitteringBackend(tiny), tiny, 1, PublishedSlots(tmp_path / "elsewhere.json"))
    assert any(c.reward < 1.0 for g in honest for c in g.completions)  # so the claim above is the cheater's doing
    assert len(PublishedSlots.load(published_slots_path(node.config.peer))) == PROMPTS


def test_no_peer_config_takes_a_cheating_setting():
    from swarm.config import load_config
    from swarm.errors import UserError

    with pytest.raises(UserError, match="cheat"):
        load_config(None, {"roles": ("inference",), "cheat": "reward"})
