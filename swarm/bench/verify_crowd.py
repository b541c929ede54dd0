"""`swarm bench verify`'s crowd section: what share of training a crowd of fresh identities buys, per attack.

Why a section of its own: a worker's history bans a cheater after a few of its groups, but identities are free, so a
crowd answers one version's slots under each identity and retires it before any history is long enough. What
decides that attack is the trainer's gate (swarm/roles/gate.py): which settled groups it hands to training.

How: the harness generates and validates a pool of real groups per class (honest, near-tie steering, int8 decoding
with the proof rebuilt), keeping each group's verdict and near-tie row. Then a run is replayed through a real
RolloutGate with signed votes: `honest_workers` long-lived honest workers answer every version (the first
`warmup_versions` alone, a run already under way), and from then on `identities` fresh attacking identities per
version answer their slots once each, before the honest workers (the trainer takes the freshest groups, first
come first). The honest workers answer less than a batch, so a batch has room the crowd competes for. Six
validators, two replicas, quorum two; each group's assigned validators vote its pooled verdict and row, except the
liars, which vote the verdict but report no flips in an attacking group; a validator the gate bans leaves the next
version's panel, as the trainer's SwarmPublisher does. After each version the trainer takes one batch
(`prompts_per_step` groups). A row reports the attack's groups sent, admitted (accepted by the quorum and not
refused: what a batch could take had it room) and trained, and their share of everything trained. The
`honest_newcomers` rows measure what the gate costs honest throughput: `identities` fresh honest workers join when
the attack would begin and stay, and the row reports how many of their groups were trained. The `from_start` rows
replay a crowd present from the run's first version, before any worker is proven (then unproven workers may fill
whole batches, the workers with the longest records first).
"""

from __future__ import annotations

import os
import random
from dataclasses import dataclass
from typing import TYPE_CHECKING

from swarm.policy.runspec import RunSpec
from swarm.roles.gate import RolloutGate
from verify.neartie import NO_NEAR_TIES, NearTies, near_ties_of
from verify.rollout import Completion, RolloutGroup
from verify.verdicts import CheckResult
from verify.votes import assign_validators, public_key_of, sign_vote
from verify.worker_history import evidence_row

if TYPE_CHECKING:
    from swarm.bench.verify_harness import Harness


@dataclass(frozen=True)
class CrowdConfig:
    """pool_groups: real groups generated and validated per class; identities / liars: the grid replayed;
    honest_workers, prompts_per_worker, prompts_per_step: the run; versions: versions the attack lasts, after
    `warmup_versions` of honest work alone; validators, replicas: the panel (quorum = replicas)."""

    pool_groups: int = 40
    identities: tuple[int, ...] = (1, 10, 100)
    liars: tuple[int, ...] = (0, 1, 2)
    honest_workers: int = 3
    prompts_per_worker: int = 2
    prompts_per_step: int = 8
    warmup_versions: int = 6
    versions: int = 8
    validators: int = 6
    replicas: int = 2
    seed: int = 0


@dataclass(frozen=True)
class Pooled:
    """One validated group's outcome: whether honest validators accept it, and its near-tie row."""

    accepted: bool
    flips: int
    tokens: int


def pools(h: Harness, cfg: CrowdConfig) -> dict[str, list[Pooled]]:
    """Real verdicts per class from the harness's model: honest, steered and int8 groups of fresh workers."""
    from swarm.bench import attacks
    from swarm.bench.verify_harness import CURRENT_VERSION
    from swarm.bench.verify_history import worker_items
    from verify.testing import honest_group

    checks = h.config.check_config()
    items = lambda tag: worker_items(h, tag, [f"{tag}-{i}" for i in range(cfg.pool_groups)], range(1))  # noqa: E731
    steerer = attacks.NearTieSteerer(checks.near_tie_tol, checks.max_near_tie_fraction)
    steered = [honest_group(h.model, h.ctx, worker=w, step=s, version=CURRENT_VERSION, group_size=h.config.group_size,
                            temperature=h.config.temperature, choose=steerer) for w, s, _ in items("crowd-steer")]
    cheap = attacks.int8_model(h.model)
    int8 = [attacks.reprove(h.model, g) for g in h.generate(cheap, items("crowd-int8"))[0]]
    honest = h.generate(h.model, items("crowd-honest"))[0]
    return {name: _pooled(h, groups) for name, groups in
            (("honest", honest), ("near_ties_steered", steered), ("int8_decoded_reproved", int8))}


def _pooled(h: Harness, groups: list[RolloutGroup]) -> list[Pooled]:
    verdicts, _ = h.validate(groups)
    rows = [(v.accepted, near_ties_of(v) or NO_NEAR_TIES) for v in verdicts]
    return [Pooled(ok, r.flips, r.tokens) for ok, r in rows]


def run_crowd(pooled: dict[str, list[Pooled]], cfg: CrowdConfig) -> dict:
    """Every (attack, identities, liars) row of the grid, and the pools' acceptance rates."""
    rows = [replay(pooled, attack, n, liars, cfg) for attack in ("near_ties_steered", "int8_decoded_reproved")
            for n in cfg.identities for liars in cfg.liars]
    rows += [replay(pooled, "honest_newcomers", n, 0, cfg) for n in cfg.identities if n <= 10]
    rows += [replay(pooled, "near_ties_steered", n, 0, cfg, from_start=True) for n in cfg.identities]
    return {"config": cfg.__dict__, "pool_accepted": {k: sum(p.accepted for p in v) / max(1, len(v))
                                                      for k, v in pooled.items()}, "rows": rows}


class _Panel:
    """The validators of the replayed run: keys, and which of them lie for the attack."""

    def __init__(self, n: int, liars: int, rng: random.Random) -> None:
        private = [rng.randbytes(32) for _ in range(n)]  # raw Ed25519 private keys, seeded
        self.keys = {public_key_of(k): k for k in private}
        self.liars = set(list(self.keys)[:liars])

    def spec(self, cfg: CrowdConfig, gate: RolloutGate) -> RunSpec:
        """The next version's panel: the banned validators left out, as the trainer's publisher does."""
        banned = getattr(gate, "validator_banned", lambda key: False)
        return RunSpec("basic_arithmetic", 100_000, "{}", 0, 0.2, "all", cfg.prompts_per_worker, 1, cfg.replicas,
                       cfg.replicas, tuple(key.hex() for key in self.keys if not banned(key)))


def replay(pooled: dict[str, list[Pooled]], attack: str, identities: int, liars: int, cfg: CrowdConfig, *,
           from_start: bool = False) -> dict:
    """One run of the grid through a RolloutGate; returns the attack's groups sent and trained. `from_start`: the
    crowd comes from the run's first version, when no worker is proven yet, and the row counts every version."""
    rng = random.Random(f"{cfg.seed}-{attack}-{identities}-{liars}-{from_start}")
    first = 0 if from_start else cfg.warmup_versions
    panel = _Panel(cfg.validators, liars, rng)
    gate = RolloutGate("bench", replicas=cfg.replicas, quorum=cfg.replicas, timeout_s=60.0, async_level=1)
    sent, trained, total, admitted = 0, 0, 0, set()
    for version in range(cfg.warmup_versions + cfg.versions):
        gate.specs[version], gate.newest = panel.spec(cfg, gate), version
        now = float(version * 100)
        if version >= first:  # the crowd answers first: the trainer takes the freshest, first come
            for i in range(identities):
                for task in range(cfg.prompts_per_worker):
                    g = _group(version, _identity(attack, version, i), task)
                    sent += 1
                    _send(gate, panel, g, rng.choice(pooled.get(attack) or pooled["honest"]), True, now)
        for w in range(cfg.honest_workers):
            for task in range(cfg.prompts_per_worker):
                _send(gate, panel, _group(version, f"honest-{w}", task), rng.choice(pooled["honest"]), False, now)
        gate.tick(now + 99.0)
        admitted |= {g.rollout_id() for g in gate.accepted if g.worker.startswith(attack)}
        batch = gate.take(cfg.prompts_per_step)
        if version >= first:
            total += len(batch)
            trained += sum(g.worker.startswith(attack) for g in batch)
        gate.forget_old(now + 99.0)
    return {"attack": attack, "identities_per_version": identities, "lying_validators": liars, "from_start": from_start,
            "attack_groups_sent": sent, "attack_groups_admitted": len(admitted), "attack_groups_trained": trained,
            "groups_trained": total,
            "attack_share_of_training": round(trained / max(1, total), 4)}


def _identity(attack: str, version: int, i: int) -> str:
    """A fresh name per version for an attacking identity; the same name every version for an honest newcomer."""
    return f"{attack}-{i}" if attack == "honest_newcomers" else f"{attack}-v{version}-{i}"


def _group(version: int, worker: str, task: int) -> RolloutGroup:
    completion = Completion((5, 6, 7), (-0.1, -0.2, -0.3), "eos", 1.0, b"\x00" * 4)
    return RolloutGroup("bench", version, os.urandom(32), worker, version, "basic_arithmetic", task, (1, 2), 0.8, 16,
                        (completion, completion))


def _send(gate: RolloutGate, panel: _Panel, g: RolloutGroup, pooled: Pooled, attacking: bool, now: float) -> None:
    """The group to the gate, then its assigned validators' votes: the pooled verdict, or a liar's for an attack."""
    gate.on_rollout(g, now)
    for key in assign_validators(g.slot().key(), gate.specs[g.policy_version].validator_keys(), gate.replicas):
        accept, flips = pooled.accepted, 0 if attacking and key in panel.liars else pooled.flips
        row = CheckResult(*evidence_row(NearTies(pooled.tokens, flips, NO_NEAR_TIES.gap_bins)))
        gate.on_vote(sign_vote(panel.keys[key], g.rollout_id(), accept, [CheckResult("sampling", accept, ""), row]),
                     now)

