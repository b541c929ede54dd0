"""`swarm status`: listen to a run's gossip for a while and say what its swarm is doing (see swarm.cli.status_view).

The observer joins through a bootstrap peer with a fresh, throw-away identity, announces no role and fetches no
policy: it only listens to heartbeats, rollouts and votes, then asks a peer holding the newest version for its
signed manifest (the stage, the task, the validators it names) and checks the signature, against the run's key
when one is given. Imports no torch.
"""

from __future__ import annotations

import argparse
import logging

MAX_SECONDS = 600.0
OBSERVER_HEARTBEAT_S = 0.25
"""Shortest long-run spacing of one peer's heartbeats the observer accepts (p2p.gossip_admission)."""


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
        "--seconds", type=float, default=15.0, help="how long to listen (peers heartbeat every 6 s by default)"
    )
    parser.add_argument("--json", action="store_true", help="print the report as one JSON object")


def run(args: argparse.Namespace) -> int:
    import trio

    from p2p.bootstrap import DEFAULT_BOOTSTRAP_FILE, resolve_bootstrap
    from swarm.cli.status_view import render, to_json
    from swarm.errors import UserError
    from swarm.policy.trust import parse_trainer_key

    if not 0 < args.seconds <= MAX_SECONDS:
        raise UserError(f"--seconds must be above 0 and at most {MAX_SECONDS:g}, got {args.seconds:g}")
    bootstrap = resolve_bootstrap(args.bootstrap or None, None,
                                  DEFAULT_BOOTSTRAP_FILE if DEFAULT_BOOTSTRAP_FILE.exists() else None)
    if not bootstrap:
        raise UserError("give --bootstrap MULTIADDR (a peer of the run), or list one in bootstrap_peers.txt")
    trainer_key = parse_trainer_key(args.trainer_key)
    logging.getLogger("p2p").setLevel(logging.ERROR)  # an unreachable bootstrap peer is the error below, once
    logging.getLogger("libp2p").setLevel(logging.CRITICAL)
    report = trio.run(observe, args.run, tuple(bootstrap), args.seconds, trainer_key)
    print(to_json(report) if args.json else render(report))
    return 0


async def observe(run: str, bootstrap: tuple[str, ...], seconds: float, trainer_key: bytes | None = None) -> dict:
    """Listen to `run` for `seconds` through `bootstrap`; the report of swarm.cli.status_view plus the newest
    manifest."""
    from p2p.host import HostConfig, open_host
    from p2p.identity import Identity
    from swarm.cli.status_view import SwarmView
    from swarm.errors import UserError

    identity = Identity.generate()
    view = SwarmView()
    unreachable = ""
    report: dict = {}
    async with open_host(HostConfig(identity=identity, bootstrap=bootstrap)) as host:
        if len(host.bootstrap_failures) == len(bootstrap):  # said outside the host's nursery: one line, no group
            unreachable = "; ".join(host.bootstrap_failures.values())
        else:
            report = await _listen_to(host, identity, run, view, seconds, trainer_key)
    if unreachable:
        raise UserError(f"no bootstrap peer answered ({unreachable})")
    return report


async def _listen_to(host, identity, run: str, view, seconds: float, trainer_key: bytes | None) -> dict:
    """Listen on the run's gossip for `seconds`, then summarise (with the newest manifest)."""
    import trio

    from p2p.gossip import GossipConfig, open_gossip
    from p2p.gossip_admission import AdmissionConfig
    from swarm.messages.gossip_bodies import DECODERS

    handlers = _handlers(view)
    # The observer does not know the run's heartbeat period (peers may be configured faster than the default),
    # so it lets each peer heartbeat up to OBSERVER_HEARTBEAT_S apart; the byte budgets still bound its CPU.
    config = GossipConfig(admission=AdmissionConfig(heartbeat_interval_s=OBSERVER_HEARTBEAT_S))
    async with open_gossip(host, run, identity, kinds=tuple(DECODERS), decoders=DECODERS, config=config) as gossip, \
            trio.open_nursery() as nursery:
        for kind, handle in handlers.items():  # each message in a scope of its own: a peer cannot end the view
            nursery.start_soon(gossip.serve, kind, handle)
        await trio.sleep(seconds)
        nursery.cancel_scope.cancel()
        refused_by_gossip = sum(gossip.stats.rejected.values())
    view.refused += refused_by_gossip  # what gossip's validator dropped: malformed, mistyped, forged, floods
    report = view.report(trio.current_time(), seconds)
    # the newest version whose manifest a holder serves and that verifies: a liar's heartbeat claiming a huge
    # version hid the real newest one behind "nobody answered"; the top claim's outcome is kept if none verifies
    for version in sorted(view.versions, reverse=True)[:4]:
        manifest = await _checked_manifest(host, view, version, trainer_key)
        if version == report["newest_version"]:
            report["manifest"] = manifest
        if manifest is not None and "REFUSED" not in str(manifest.get("signature")):
            report.update(newest_version=version, newest_manifest=view.versions[version].hex(), manifest=manifest)
            break
    return report


def _handlers(view) -> dict:
    import trio

    from p2p.identity import peer_id_from_public_bytes

    def heartbeat(env) -> None:
        view.on_heartbeat(env.sender_peer_id, env.message, trio.current_time())

    def rollout(env) -> None:
        view.on_rollouts(env.sender_peer_id, list(env.message.items))

    def vote(env) -> None:  # every vote's signature and voter were checked by gossip's validator
        view.on_votes(env.sender_peer_id, list(env.message.votes), lambda v: peer_id_from_public_bytes(v.validator))

    return {"heartbeat": heartbeat, "rollout": rollout, "vote": vote}


async def _checked_manifest(host, view, version: int, trainer_key: bytes | None) -> dict | None:
    """_newest_manifest, with whatever a holder's reply makes it raise turned into a refusal of that version:
    a manifest with a field of the wrong type must not end `swarm status`."""
    try:
        return await _newest_manifest(host, view, version, trainer_key)
    except Exception as exc:  # noqa: BLE001 - one peer's manifest never ends the view
        logging.getLogger(__name__).debug("manifest of v%d refused", version, exc_info=True)
        return {"version": version, "signature": f"REFUSED: {type(exc).__name__}: {exc}"[:300]}


async def _newest_manifest(host, view, version: int, trainer_key: bytes | None) -> dict | None:
    """The newest version's manifest from a peer that holds it, summarised; None when no holder answers."""
    from p2p.errors import P2PError
    from p2p.host import ensure_connected
    from p2p.manifest import decode_signed, verify_manifest
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


def _manifest_summary(manifest, signer: bytes, trainer_key: bytes | None) -> dict:
    """What `swarm status` shows of a verified manifest: size, stage, generation settings, task, validators."""
    from swarm.policy.runspec import RunSpec

    try:
        spec = RunSpec.from_model(manifest.model)
    except Exception:  # noqa: BLE001 - a manifest not published by a swarm trainer still has its settings
        spec = None
    gen = manifest.generation
    return {
        "version": manifest.version, "mib": round(manifest.total_size / 2**20, 2),
        "stage": f"{spec.segment if spec else '?'}@{gen.max_new_tokens}", "group_size": gen.group_size,
        "max_new_tokens": gen.max_new_tokens, "temperature": gen.temperature,
        "task": spec.task if spec else "?", "validators": len(spec.validators) if spec else 0,
        "quorum": spec.quorum if spec else 0, "replicas": spec.replicas if spec else 0,
        "signature": ("signed by the run's trainer key" if trainer_key else
                      f"signed by {signer.hex()[:16]}... (not checked against a run key: give --trainer-key)"),
    }
