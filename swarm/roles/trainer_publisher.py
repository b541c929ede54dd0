"""The trainer's side of the swarm: which validators and workers it knows, and how it signs, seeds and announces
each new policy version (the trainer role, swarm.roles.trainer, decides when)."""

from __future__ import annotations

import json
import logging
import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import trio

from p2p.pieces.manifest import GenerationSettings, PatchRef, build_manifest, sign_manifest
from p2p.pieces.patch import encode_patch
from swarm.config import TrainerSettings
from swarm.event_types import Published, ValidatorIgnored, WaitingForValidators
from swarm.node.context import RoleContext
from swarm.policy.policy_patches import PATCH_FILE, WEIGHTS, keyframe_due, patch_pays
from swarm.policy.runspec import RunSpec
from swarm.policy.task_file import RunTaskFile, place_task_file
from swarm.policy.trust import parse_public_key
from verify.reward_loading import load_reward

if TYPE_CHECKING:
    from trainer.config import TrainerConfig

log = logging.getLogger(__name__)


class SwarmPublisher:
    """Turns the training run's newest policy directory into a signed, seeded manifest with the run spec."""

    def __init__(self, ctx: RoleContext[TrainerSettings], cfg: TrainerConfig, task_file: RunTaskFile | None = None
                 ) -> None:
        self.ctx, self.cfg = ctx, cfg
        self.task_file = task_file  # swarm.policy.task_file.RunTaskFile: the run's task file, listed in every manifest
        self.root = Path(ctx.peer.data_dir) / "swarm-policies"
        self.published: set[int] = set()
        keys = ctx.settings.trainer.validator_keys
        self.allowed = {parse_public_key(k, "--validator-key") for k in keys} if keys else None
        self.ignored: set[str] = set()  # heard-from validators outside `allowed`, reported once
        self.excluded = lambda key: False  # the gate's banned validators (RolloutGate.validator_banned): never named
        self.last: tuple[int, bytes] | None = None  # (version, manifest id) of the newest version published

    def known_validators(self) -> tuple[str, ...]:
        """Public keys (hex, sorted) of the validators this peer hears heartbeats from (only those of
        --validator-key when it is given; another is reported once and ignored), banned ones left out."""
        from p2p.identity import public_bytes_from_peer_id

        heard = {p: public_bytes_from_peer_id(p) for p, roles in self.ctx.peer_roles.items() if "validator" in roles}
        heard = {p: key for p, key in heard.items() if not self.excluded(key)}
        if self.allowed is None:
            return tuple(sorted(k.hex() for k in heard.values()))
        for peer in [p for p, k in heard.items() if k not in self.allowed and p not in self.ignored]:
            self.ignored.add(peer)
            self.ctx.events.emit(ValidatorIgnored(peer=peer, message=(
                f"validator {peer} is not among --validator-key; its votes will not count")))
        return tuple(sorted(k.hex() for k in heard.values() if k in self.allowed))

    def workers_known(self) -> bool:
        """Whether any inference peer is heard from: a new version only helps if someone will answer it."""
        return bool(self.known_workers())

    def known_workers(self) -> set[str]:
        """Peer ids of the inference peers this peer hears heartbeats from."""
        return {peer for peer, roles in self.ctx.peer_roles.items() if "inference" in roles}

    def validators_changed(self, spec: RunSpec) -> bool:
        """Whether validators are known now and differ from those `spec` names (some joined late, some left)."""
        known = set(self.known_validators())
        return bool(known) and known != set(spec.validators)

    def validators_departed(self, spec: RunSpec) -> int:
        """How many of the validators `spec` names are no longer heard from (their heartbeats stopped)."""
        return len(set(spec.validators) - set(self.known_validators()))

    async def wait_for_validators(self, quorum: int, replicas: int, grace_s: float = 30.0) -> None:
        """Before the first version: wait for `quorum` validators, then give the rest of `replicas` `grace_s` to
        announce themselves (every validator a version names shares its rollouts' prefills)."""
        await self.wait_for_quorum(quorum)
        with trio.move_on_after(grace_s):
            while len(self.known_validators()) < replicas:
                await trio.sleep(0.2)

    async def wait_for_quorum(self, quorum: int, report_every_s: float = 20.0) -> None:
        """Block until `quorum` validators are heard from, saying every `report_every_s` what it waits for.

        Why block: a version names its validators for good, and one naming fewer than the quorum could never have
        a rollout accepted. Published anyway, it would cost every worker a round of generation for nothing (the
        gate refuses such rollouts without blaming the workers; before it did, each was settled as rejected and an
        honest worker was banned within four groups)."""
        since = reported = trio.current_time()
        while (known := len(self.known_validators())) < quorum:
            now = trio.current_time()
            if now - reported >= report_every_s:
                reported = now
                self.ctx.events.emit(WaitingForValidators(
                    known=known, quorum=quorum, waited_s=round(now - since, 1), message=(
                        f"the quorum needs {quorum} validators and {known} are heard from"
                        f"{'' if self.allowed is None else ' (of those --validator-key lists)'}: "
                        f"no version goes out until enough join ({now - since:.0f} s so far)")))
            await trio.sleep(0.2)

    def spec_for(self, segment: str) -> RunSpec:
        cfg, section, task_file = self.cfg, self.ctx.settings.trainer, self.task_file
        return RunSpec(task_file.name if task_file else cfg.task, cfg.task_size,
                       json.dumps(cfg.task_config, sort_keys=True), cfg.seed, cfg.eval_fraction, segment,
                       section.prompts_per_worker, cfg.async_level, section.replicas,
                       section.quorum, self.known_validators(), section.precision,
                       task_file.root if task_file else "", cfg.reward,
                       load_reward(cfg.reward).code_hash if cfg.reward else "")

    async def publish(self, version: int, source: Path,
                      before_announce: Callable[[RunSpec], None] = lambda spec: None) -> RunSpec:

        generation = json.loads((source / "generation.json").read_text())
        spec = self.spec_for(generation["data"])
        target = self.root / f"v{version}"
        target.mkdir(parents=True, exist_ok=True)
        if not (target / WEIGHTS).exists():
            os.link(source / WEIGHTS, target / WEIGHTS)
        if self.task_file:
            place_task_file(self.task_file, target)
        model = json.loads((source / "model.json").read_text())
        (target / "model.json").write_text(json.dumps({**model, "run_spec": spec.to_dict()}, sort_keys=True))
        settings = GenerationSettings(int(generation["group_size"]), float(generation["temperature"]),
                                      int(generation["max_new_tokens"]), int(generation["stage_index"]))
        patch = await self._patch(version, target)
        manifest = await trio.to_thread.run_sync(lambda: build_manifest(
            target, run=self.ctx.peer.run, version=version, parent_version=version - 1 if version else None,
            created_at=time.time(), generation=settings, piece_size=self.ctx.settings.piece_kb * 1024,
            data_files=(self.task_file.name,) if self.task_file else (), patch=patch))
        signed = sign_manifest(manifest, self.ctx.identity.sign, self.ctx.identity.public_bytes).to_bytes()
        self.ctx.mirror.adopt(signed, local_dir=target)
        self.prune()
        before_announce(spec)  # the gate must know the version before any worker can answer it
        await self.ctx.announce_policy(signed, manifest)
        self.published.add(version)
        self.last = (version, manifest.id)
        patch_file = manifest.patch_file
        self.ctx.events.emit(Published(version=version, id=manifest.id.hex(), bytes=manifest.full_size(),
                                        patch_bytes=patch_file.size if patch_file else None,
                                        validators=len(spec.validators), stage=generation["stage"]))
        return spec

    async def _patch(self, version: int, target: Path) -> PatchRef | None:
        """Write `target`'s patch over the newest version published, when it is still seeded and the patch pays
        (policy_patches.keyframe_due); None for a keyframe."""
        parent = self.last
        parent_dir = self.root / f"v{parent[0]}" if parent else None
        if parent is None or not (parent_dir / WEIGHTS).is_file() or self.cfg.publish_dtype == "float32":
            return None
        if keyframe_due(version, self.ctx.settings.trainer.keyframe_every):
            return None
        stats = await trio.to_thread.run_sync(encode_patch, [parent_dir / WEIGHTS], [target / WEIGHTS],
                                              target / PATCH_FILE)
        if not patch_pays(stats.bytes, (target / WEIGHTS).stat().st_size):
            (target / PATCH_FILE).unlink()
            return None
        return PatchRef(parent[1], parent[0], PATCH_FILE)

    def prune(self) -> None:
        """Delete the published copies of versions the mirror no longer holds.

        Why: the store serves a trainer's copy in place and never deletes it (it may be the trainer's own file), so
        each version stayed on disk for good: a SmolLM2 simulation filled 32 GB, one 514 MB copy per step, and
        its trainer failed at step 40 with no space left."""
        mirrored = {policy.manifest.version for policy in self.ctx.mirror.policies.values()}
        for entry in self.root.iterdir() if self.root.is_dir() else ():
            version = entry.name[1:]
            if entry.name.startswith("v") and version.isdigit() and int(version) not in mirrored:
                shutil.rmtree(entry, ignore_errors=True)
