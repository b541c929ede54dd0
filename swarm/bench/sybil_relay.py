"""`swarm bench sybil`'s relay attack: N fresh identities take reservations on a public peer serving as a relay and
leave; then an honest private peer asks that relay for a reservation; then every identity holds a circuit through
the relay to an honest private peer that reserved before the crowd came, while an honest peer dials it through the
relay, and dials it again once the crowd has closed its circuits.

Reported beside the relay's CPU and memory: reservations the attackers were granted, seconds from the last attacker
leaving to the honest peer's reservation (null: none within `--reservation-wait-s`), circuits the attackers held, and
seconds each honest circuit took (null: refused or timed out).

Where each party connects from (`--crowd-ips`): "many" gives every attacker and every honest peer a loopback
address of its own (127.0.0.16 on for the crowd, 127.0.0.10 to .13 for the honest peers), as real ones come from
their own, so the relay's per-IP caps see them apart; "one" puts them all on 127.0.0.1, where those caps lump the
honest peers in with the crowd.
"""

from __future__ import annotations

import argparse
from collections.abc import Awaitable, Callable

import trio

from p2p.host.p2p_host import HostConfig, P2PHost, open_host
from p2p.identity import Identity
from p2p.reach.probe import ReachConfig
from swarm.bench.sybil_measure import (
    Meter,
    Target,
    attacker_config,
    dialing_from,
    in_lanes,
    loopback_ip,
    sample_until_cancelled,
)

RESERVE_TIMEOUT_S = 5.0
CIRCUIT_TIMEOUT_S = 10.0
RETRY_EVERY_S = 0.5
HONEST_IPS = {"early": "127.0.0.10", "late": "127.0.0.11", "during": "127.0.0.12", "after": "127.0.0.13"}
"""The honest peers' own addresses when the parties connect from many (the crowd's start at 127.0.0.16)."""


def private_config(identity: Identity, relay_addr: str, ip: str) -> HostConfig:
    """An honest private peer on `ip` that bootstraps from the relay and asks it for a reservation as it starts."""
    return HostConfig(identity=identity, listen=(f"/ip4/{ip}/tcp/0",), bootstrap=(relay_addr,),
                      reach=ReachConfig(mode="private", hole_punch=False))


def parties(n: int, many: bool) -> tuple[list[str], dict[str, str]]:
    """The crowd's `n` addresses and the honest peers' (HONEST_IPS' keys): each its own, or all 127.0.0.1."""
    if many:
        return [loopback_ip(i) for i in range(n)], dict(HONEST_IPS)
    return ["127.0.0.1"] * n, dict.fromkeys(HONEST_IPS, "127.0.0.1")


async def reserve_and_leave(identity: Identity, ip: str, relay_addr: str) -> bool:
    """Connect from `ip`, take a reservation, disconnect (the host closes); True when the relay granted it."""
    relay_id = relay_addr.rsplit("/p2p/", 1)[1]
    async with open_host(attacker_config(identity, ip=ip), dialing_from(ip)) as host:
        await host.connect(relay_addr)
        return await host.reach.relaying.reserve(relay_addr, relay_id, host.nursery, RESERVE_TIMEOUT_S)


async def wait_reserved(host: P2PHost, relay_addr: str, since: float, wait_s: float) -> float | None:
    """Seconds from `since` until `host` holds a reservation on the relay, asking again every RETRY_EVERY_S; None
    when none came within `wait_s`."""
    relay_id = relay_addr.rsplit("/p2p/", 1)[1]
    with trio.move_on_at(since + wait_s):
        while relay_id not in host.reach.relaying.reservations:
            if not await host.reach.relaying.reserve(relay_addr, relay_id, host.nursery, RESERVE_TIMEOUT_S):
                await trio.sleep(RETRY_EVERY_S)
        return round(trio.current_time() - since, 2)
    return None


async def hold_circuit(identity: Identity, ip: str, relay_addr: str, peer_id: str, held: list[int],
                       release: trio.Event):
    """Connect to the relay from `ip`, open a circuit through it to `peer_id` and hold it until `release`."""
    async with open_host(attacker_config(identity, ip=ip), dialing_from(ip)) as host:
        await host.connect(relay_addr)
        with trio.move_on_after(CIRCUIT_TIMEOUT_S):
            await host.connect(f"{relay_addr}/p2p-circuit/p2p/{peer_id}")
            held[0] += 1
        await release.wait()


async def timed_circuit(relay_addr: str, peer_id: str, ip: str) -> float | None:
    """Seconds an honest peer on `ip` takes to reach `peer_id` through the relay; None when refused or too slow."""
    async with open_host(attacker_config(Identity.generate(), ip=ip), dialing_from(ip)) as host:
        started = trio.current_time()
        try:
            await host.connect(relay_addr)
            with trio.fail_after(CIRCUIT_TIMEOUT_S):
                await host.connect(f"{relay_addr}/p2p-circuit/p2p/{peer_id}")
        except Exception:  # noqa: BLE001 - HostError or TooSlowError: the honest circuit failed
            return None
        return round(trio.current_time() - started, 2)


async def circuits_phase(crowd: list[tuple[Identity, str]], honest: dict[str, str], relay_addr: str,
                         peer_id: str) -> dict:
    """Every identity holds a circuit to `peer_id`, opened all at once; meanwhile an honest peer dials one, and
    again once the crowd has closed its circuits (a relay that does not take them back stays shut)."""
    held, release = [0], trio.Event()
    async with trio.open_nursery() as nursery:
        for identity, ip in crowd:
            nursery.start_soon(_quietly, hold_circuit, identity, ip, relay_addr, peer_id, held, release)
        await trio.sleep(min(CIRCUIT_TIMEOUT_S, 1.0 + 0.1 * len(crowd)))  # the crowd's dials go out first
        during = await timed_circuit(relay_addr, peer_id, honest["during"])
        release.set()
    await trio.sleep(1.0)
    after = await timed_circuit(relay_addr, peer_id, honest["after"])
    return {"circuits_held": held[0], "honest_circuit_s": during, "honest_circuit_after_crowd_s": after}


async def _quietly(fn: Callable[..., Awaitable[object]], *args: object) -> None:
    try:
        await fn(*args)
    except Exception:  # noqa: BLE001 - the relay refused this identity: counted by what it did not hold
        pass


async def relay_reservations(relay: Target, run: str, identities: list[Identity], args: argparse.Namespace) -> dict:
    """The whole relay attack against `relay` (a public `swarm peer start`), measured from the first reservation."""
    meter = Meter(relay.pid)
    ips, honest = parties(len(identities), args.crowd_ips == "many")
    crowd = list(zip(identities, ips, strict=True))
    async with open_host(private_config(Identity.generate(), relay.addr, honest["early"]),
                         dialing_from(honest["early"])) as early, trio.open_nursery() as nursery:
        meter.start()
        nursery.start_soon(sample_until_cancelled, meter)
        granted: list = []
        with trio.move_on_after(args.seconds):
            await in_lanes(crowd, args.parallel, lambda party: reserve_and_leave(*party, relay.addr), granted)
        left_at = trio.current_time()
        async with open_host(private_config(Identity.generate(), relay.addr, honest["late"]),
                             dialing_from(honest["late"])) as late:
            after = await wait_reserved(late, relay.addr, left_at, args.reservation_wait_s)
        circuits = await circuits_phase(crowd, honest, relay.addr, early.peer_id)
        meter.stop()
        nursery.cancel_scope.cancel()
    return {**meter.result(), "crowd_ips": args.crowd_ips, "reservations_granted": sum(bool(g) for g in granted),
            "reservations_refused": sum(g is False for g in granted), "attackers_failed": granted.count(None),
            "reservation_after_s": after, **circuits, "peer_died": meter.died or not relay.alive()}
