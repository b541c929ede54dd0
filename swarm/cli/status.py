"""`swarm status`: listen to a run's gossip for a while and say what its swarm is doing (see swarm.cli.status_view).

The observer joins through a bootstrap peer with a fresh, throw-away identity, announces no role and fetches no
policy: it only listens to heartbeats, rollouts and votes, then asks a peer holding the newest version for its
signed manifest (the stage, the task, the validators it names) and checks the signature, against the run's key
when one is given. With --watch it keeps listening and redraws the same view every few seconds until Ctrl-C: a
live table on a terminal (swarm.cli.status_live), one JSON object per line otherwise. Imports no torch.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TYPE_CHECKING, TypeVar

import trio
from rich.console import Console
from rich.live import Live

from p2p.bootstrap import DEFAULT_BOOTSTRAP_FILE, resolve_bootstrap
from p2p.errors import P2PError
from p2p.pieces.manifest import decode_signed, verify_manifest
from swarm.cli.status_live import live_renderable
from swarm.errors import UserError
from swarm.shutdown import run_trio

if TYPE_CHECKING:
    from p2p.gossip.envelope import Envelope
    from p2p.gossip.service import Gossip
    from p2p.host.p2p_host import P2PHost
    from p2p.identity import Identity
    from p2p.pieces.manifest import PolicyManifest
    from swarm.cli.status_view import SwarmView

MAX_SECONDS = 600.0
MANIFEST_RETRY_S = 30.0
"""With --watch: how long after a newest version's holders did not answer they are asked again."""
MIN_EVERY_S = 0.2
"""The shortest --every: a refresh recomputes the whole view."""
OBSERVER_HEARTBEAT_S = 0.25
"""Shortest long-run spacing of one peer's heartbeats the observer accepts (p2p.gossip.admission)."""
Result = TypeVar("Result")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--run", required=True, help="the run's name")
    parser.add_argument("--bootstrap", action="append", default=[], metavar="MULTIADDR",
                        help="a peer of the run to join through (repeatable; default: bootstrap_peers.txt)")
    parser.add_argument(
        "--trainer-key",
        dest="trainer_key",
        default=None,
        help="the run's trainer public key (hex or key file): the newest manifest is checked against it",
    )
    parser.add_argument(
        "--seconds", type=float, default=15.0,
        help="how long to listen before the one report (peers heartbeat every 6 s by default); not with --watch"
    )
    parser.add_argument("--watch", action="store_true",
                        help="keep listening and redraw the view until Ctrl-C (JSON lines when not on a terminal)")
    parser.add_argument("--every", type=float, default=2.0,
                        help="with --watch: seconds between refreshes (default: 2)")
    parser.add_argument("--json", action="store_true",
                        help="print the report as one JSON object (with --watch: one JSON line per refresh)")


def run(args: argparse.Namespace) -> int:
    from swarm.cli.status_view import render, to_json
    from swarm.policy.trust import parse_trainer_key

    if not 0 < args.seconds <= MAX_SECONDS:
        raise UserError(f"--seconds must be above 0 and at most {MAX_SECONDS:g}, got {args.seconds:g}")
    if not MIN_EVERY_S <= args.every <= MAX_SECONDS:
        raise UserError(f"--every must be between {MIN_EVERY_S:g} and {MAX_SECONDS:g} seconds, got {args.every:g}")
    bootstrap = resolve_bootstrap(args.bootstrap or None, None,
                                  DEFAULT_BOOTSTRAP_FILE if DEFAULT_BOOTSTRAP_FILE.exists() else None)
    if not bootstrap:
        raise UserError("give --bootstrap MULTIADDR (a peer of the run), or list one in bootstrap_peers.txt")
    trainer_key = parse_trainer_key(args.trainer_key)
    quiet_network_logs(args)
    if args.watch:
        return _watch(args, tuple(bootstrap), trainer_key)
    report = run_trio(observe, args.run, tuple(bootstrap), args.seconds, trainer_key)
    print(to_json(report) if args.json else render(report))
    return 0


def quiet_network_logs(args: argparse.Namespace) -> None:
    """An observer's network chatter is not the user's business: the p2p layers say only errors (an unreachable
    bootstrap peer is the error the command prints, once), unless -v or --log-level asked for more."""
    import libp2p  # noqa: F401 - its import resets its logger's level, so it comes before the level is set

    logging.getLogger("libp2p").setLevel(logging.CRITICAL)  # a peer that stops answering is not the user's error
    if not (getattr(args, "verbose", None) or getattr(args, "log_level", None)):
        logging.getLogger("p2p").setLevel(logging.ERROR)


def _watch(args: argparse.Namespace, bootstrap: tuple[str, ...], trainer_key: bytes | None) -> int:
    """Redraw the view every `--every` seconds until Ctrl-C (which ends in swarm.cli.main's one line, status 130): a
    live rich view on a terminal, one JSON line per refresh when stdout is a pipe or with --json."""

    from swarm.cli.status_view import to_json

    console = Console(file=sys.stdout)
    if args.json or not console.is_terminal:
        def show(report: dict, watched_s: float) -> None:
            print(to_json(report), flush=True)

        run_trio(watch, args.run, bootstrap, args.every, show, trainer_key)
        return 0
    with Live(console=console, auto_refresh=False, transient=False) as live:
        def draw(report: dict, watched_s: float) -> None:
            live.update(live_renderable(report, watched_s), refresh=True)

        run_trio(watch, args.run, bootstrap, args.every, draw, trainer_key)
    return 0


async def observe(run: str, bootstrap: tuple[str, ...], seconds: float, trainer_key: bytes | None = None) -> dict:
    """Listen to `run` for `seconds` through `bootstrap`; the report of swarm.cli.status_view plus the newest
    manifest."""

    async def once(host: P2PHost, identity: Identity, view: SwarmView) -> dict:
        async with _listening(host, identity, run, view) as gossip:
            await trio.sleep(seconds)
            report = _report(view, gossip, seconds)
        return await _with_newest_manifest(host, view, report, trainer_key)

    return await _joined(bootstrap, once)


async def watch(run: str, bootstrap: tuple[str, ...], every_s: float, show: Callable[[dict, float], None],
                trainer_key: bytes | None = None, refreshes: int | None = None) -> None:
    """Listen to `run` until cancelled (or `refreshes` reports), calling `show(report, seconds watched)` every
    `every_s`; the newest manifest comes from NewestManifest."""

    async def forever(host: P2PHost, identity: Identity, view: SwarmView) -> None:
        started, shown, newest = trio.current_time(), 0, NewestManifest(trainer_key)
        async with _listening(host, identity, run, view) as gossip, trio.open_nursery() as fetches:
            while refreshes is None or shown < refreshes:
                await trio.sleep(every_s)
                watched = trio.current_time() - started
                report = _report(view, gossip, watched)
                newest.refresh(fetches, host, view, report, trio.current_time())
                show(newest.overlay(report), watched)
                shown += 1
            fetches.cancel_scope.cancel()

    await _joined(bootstrap, forever)


class NewestManifest:
    """The newest manifest for a watch, fetched in the background so that a holder slow to answer never freezes
    the view: again when the newest version changes, or when no holder answered (at most every MANIFEST_RETRY_S).
    A report shows it only while it is the manifest of the version the report calls the newest."""

    def __init__(self, trainer_key: bytes | None) -> None:
        self.trainer_key = trainer_key
        self.claimed: object = ()  # the newest version claimed at the last fetch (() before the first)
        self.found: dict = {}
        self.found_for: object = ()  # the claim `found` answers
        self.retry_at = 0.0
        self.fetching = False

    def refresh(self, nursery: trio.Nursery, host: P2PHost, view: SwarmView, report: dict, now: float) -> None:
        """Start a fetch when the claim changed or its holders were silent, unless one is under way."""
        changed = report["newest_version"] != self.claimed
        silent = self.found.get("manifest") is None and now >= self.retry_at
        if self.fetching or not (changed or silent):
            return
        self.claimed, self.retry_at, self.fetching = report["newest_version"], now + MANIFEST_RETRY_S, True
        nursery.start_soon(self._fetch, host, view, dict(report))

    async def _fetch(self, host: P2PHost, view: SwarmView, report: dict) -> None:
        try:
            found = await _with_newest_manifest(host, view, report, self.trainer_key)
            self.found = {k: v for k, v in found.items() if k in ("newest_version", "newest_manifest", "manifest")}
            self.found_for = report["newest_version"]
        finally:
            self.fetching = False

    def overlay(self, report: dict) -> dict:
        return {**report, **self.found} if self.found_for == report["newest_version"] else report


async def _joined(bootstrap: tuple[str, ...], listen: Callable[[P2PHost, Identity, SwarmView], Awaitable[Result]]
                  ) -> Result | None:
    """Join through `bootstrap` with a throw-away identity and run `listen(host, identity, view)`."""
    from p2p.host.p2p_host import HostConfig, open_host
    from p2p.identity import Identity
    from swarm.cli.status_view import SwarmView

    identity = Identity.generate()
    unreachable = ""
    result = None
    async with open_host(HostConfig(identity=identity, bootstrap=bootstrap)) as host:
        if len(host.bootstrap_failures) == len(bootstrap):  # said outside the host's nursery: one line, no group
            unreachable = "; ".join(host.bootstrap_failures.values())
        else:
            result = await listen(host, identity, SwarmView())
    if unreachable:
        raise UserError(f"no bootstrap peer answered ({unreachable})")
    return result


@contextlib.asynccontextmanager
async def _listening(host: P2PHost, identity: Identity, run: str, view: SwarmView) -> AsyncIterator[Gossip]:
    """The run's gossip feeding `view` while the block runs (each message in a scope of its own: no peer can end
    the view); yields the gossip service, whose validator's refusals count in the report."""

    from p2p.gossip.admission import AdmissionConfig
    from p2p.gossip.service import GossipConfig, open_gossip
    from swarm.messages.gossip_bodies import DECODERS

    # The observer does not know the run's heartbeat period (peers may be configured faster than the default),
    # so it lets each peer heartbeat up to OBSERVER_HEARTBEAT_S apart; the byte budgets still bound its CPU.
    config = GossipConfig(admission=AdmissionConfig(heartbeat_interval_s=OBSERVER_HEARTBEAT_S))
    async with open_gossip(host, run, identity, kinds=tuple(DECODERS), decoders=DECODERS, config=config) as gossip, \
            trio.open_nursery() as nursery:
        for kind, handle in _handlers(view).items():
            nursery.start_soon(gossip.serve, kind, handle)
        yield gossip
        nursery.cancel_scope.cancel()


def _report(view: SwarmView, gossip: Gossip, window_s: float) -> dict:
    """The view's report, counting what gossip's validator dropped (malformed, mistyped, forged, floods)."""

    report = view.report(trio.current_time(), window_s)
    report["refused_messages"] += sum(gossip.stats.rejected.values())
    return report


async def _with_newest_manifest(host: P2PHost, view: SwarmView, report: dict, trainer_key: bytes | None) -> dict:
    """`report` with the newest version whose manifest a holder serves and that verifies: a liar's heartbeat
    claiming a huge version hid the real newest one behind "nobody answered"; the top claim's outcome is kept if
    none verifies."""
    for version in sorted(view.versions, reverse=True)[:4]:
        manifest = await _checked_manifest(host, view, version, trainer_key)
        if version == report["newest_version"]:
            report["manifest"] = manifest
        if manifest is not None and "REFUSED" not in str(manifest.get("signature")):
            report.update(newest_version=version, newest_manifest=view.versions[version].hex(), manifest=manifest)
            if trainer_key is not None and manifest.get("validator_ids"):  # checked against the run's own key
                view.run_validators = frozenset(manifest["validator_ids"])
            break
    return report


def _handlers(view: SwarmView) -> dict[str, Callable[[Envelope], None]]:
    from p2p.identity import peer_id_from_public_bytes
    from swarm.messages.gossip_bodies import Heartbeat, RolloutMessage, VoteBatch

    def heartbeat(env: Envelope) -> None:
        view.on_heartbeat(env.sender_peer_id, env.decoded(Heartbeat), trio.current_time())

    def rollout(env: Envelope) -> None:
        view.on_rollouts(env.sender_peer_id, list(env.decoded(RolloutMessage).items), trio.current_time())

    def vote(env: Envelope) -> None:  # every vote's signature and voter were checked by gossip's validator
        view.on_votes(env.sender_peer_id, list(env.decoded(VoteBatch).votes),
                      lambda v: peer_id_from_public_bytes(v.validator), trio.current_time())

    return {"heartbeat": heartbeat, "rollout": rollout, "vote": vote}


async def _checked_manifest(host: P2PHost, view: SwarmView, version: int, trainer_key: bytes | None) -> dict | None:
    """_newest_manifest, with whatever a holder's reply makes it raise turned into a refusal of that version:
    a manifest with a field of the wrong type must not end `swarm status`."""
    try:
        return await _newest_manifest(host, view, version, trainer_key)
    except Exception as exc:  # noqa: BLE001 - one peer's manifest never ends the view
        logging.getLogger(__name__).debug("manifest of v%d refused", version, exc_info=True)
        return {"version": version, "signature": f"REFUSED: {type(exc).__name__}: {exc}"[:300]}


async def _newest_manifest(host: P2PHost, view: SwarmView, version: int, trainer_key: bytes | None) -> dict | None:
    """The newest version's manifest from a peer that holds it, summarised; None when no holder answers."""
    from p2p.host.p2p_host import ensure_connected
    from swarm.policy.manifest_protocol import fetch_manifest

    wanted = view.versions[version]
    for peer, seen in [(p, seen) for p, seen in view.peers.items() if version in seen.holds][:4]:
        try:
            await ensure_connected(host, peer, seen.addrs)  # the observer joined through one peer only
            signed = await fetch_manifest(host, peer, wanted)
        except P2PError:
            continue
        if signed is None:
            continue
        try:
            signer = decode_signed(signed).public_key
            manifest = verify_manifest(signed, trainer_key or signer)
        except P2PError as exc:
            return {"version": version, "signature": f"REFUSED: {exc}"}
        if manifest.id == wanted:
            return _manifest_summary(manifest, signer, trainer_key)
    return None


def _manifest_summary(manifest: PolicyManifest, signer: bytes, trainer_key: bytes | None) -> dict:
    """What `swarm status` shows of a verified manifest: size, stage, generation settings, task, validators."""
    from p2p.identity import peer_id_from_public_bytes
    from swarm.policy.runspec import RunSpec

    try:
        spec = RunSpec.from_model(manifest.model)
        validator_ids = [peer_id_from_public_bytes(key) for key in spec.validator_keys()]
    except Exception:  # noqa: BLE001 - a manifest not published by a swarm trainer still has its settings
        spec, validator_ids = None, []
    gen = manifest.generation
    return {
        "version": manifest.version, "mib": round(manifest.total_size / 2**20, 2),
        "stage": f"{spec.segment if spec else '?'}@{gen.max_new_tokens}", "group_size": gen.group_size,
        "max_new_tokens": gen.max_new_tokens, "temperature": gen.temperature,
        "task": spec.task if spec else "?", "validators": len(spec.validators) if spec else 0,
        "quorum": spec.quorum if spec else 0, "replicas": spec.replicas if spec else 0,
        "validator_ids": validator_ids,
        "signature": ("signed by the run's trainer key" if trainer_key else
                      f"signed by {signer.hex()[:16]}... (not checked against a run key: give --trainer-key)"),
    }
