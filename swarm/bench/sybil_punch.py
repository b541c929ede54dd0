"""`swarm bench sybil`'s hole-punch attack: N fresh identities reach a private peer through a relay and start DCUtR
sessions whose CONNECT names third-party addresses; the private peer answers SYNC by dialing them.

The third party is the bench's own: listeners on 127.0.0.2 to 127.0.0.9 that count every TCP connection they receive
(and close it). A quarter of the identities (at least `--parallel`) attack at once, as their sessions mostly wait.
Each identity runs up to PUNCH_SESSIONS sessions on one circuit, then reconnects with the same
identity and runs them again (RECONNECTS circuits in all): a bound that a reconnection resets is no bound. The relay
is the bench's own host with room for every circuit, so the private peer's bounds are what is measured; with
`--punch-relay peer` it is a `swarm peer start` with the default limits, and the circuits it refuses
(`circuits_refused`) cap the attack. Reported:
the private peer's CPU and memory, the third-party connections, and the sessions the peer took part in.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path

import trio
from libp2p.relay.circuit_v2.dcutr import PROTOCOL_ID as DCUTR_PROTOCOL
from libp2p.relay.circuit_v2.dcutr import read_dcutr_msg
from libp2p.relay.circuit_v2.pb.dcutr_pb2 import HolePunch
from libp2p.relay.circuit_v2.utils import write_delimited_msg
from multiaddr import Multiaddr

from p2p.host.p2p_host import HostConfig, P2PHost, open_host
from p2p.identity import Identity
from p2p.reach.probe import ReachConfig
from p2p.reach.relay_limits import RelayLimits
from swarm.bench.sybil_measure import (
    Meter,
    Target,
    attacker_config,
    fresh_identities,
    in_lanes,
    sample_until_cancelled,
    start_peer,
)

THIRD_PARTY_IPS = tuple(f"127.0.0.{k}" for k in range(2, 10))
PUNCH_SESSIONS = 4
RECONNECTS = 2
SESSION_TIMEOUT_S = 5.0
DIAL_GRACE_S = 1.0
"""Seconds after SYNC that a session's circuit stays up, so the private peer's dials go out before we hang up."""


class ThirdParty:
    """Listeners the bench owns, standing for hosts the attackers want dialed; counts the connections they get."""

    def __init__(self) -> None:
        self.connections = 0
        self.addrs: list[str] = []

    async def serve(self, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        listeners = [listener for ip in THIRD_PARTY_IPS for listener in await trio.open_tcp_listeners(0, host=ip)]
        self.addrs = [f"/ip4/{ip}/tcp/{listener.socket.getsockname()[1]}"
                      for ip, listener in zip(THIRD_PARTY_IPS, listeners)]
        task_status.started()
        await trio.serve_listeners(self._count, listeners)

    async def _count(self, stream: trio.SocketStream) -> None:
        self.connections += 1
        await stream.aclose()


def _message(kind: int, addrs: list[str]) -> HolePunch:
    msg = HolePunch()
    msg.type = kind
    msg.ObsAddrs.extend(Multiaddr(a).to_bytes() for a in addrs)
    return msg


async def punch_session(host: P2PHost, peer_id: str, addrs: list[str]) -> bool:
    """One DCUtR session as its initiator: CONNECT naming `addrs`, the peer's CONNECT, SYNC; True when the peer took
    part (answered our CONNECT)."""
    stream = await host.new_stream(peer_id, DCUTR_PROTOCOL)
    try:
        with trio.fail_after(SESSION_TIMEOUT_S):
            await write_delimited_msg(stream, _message(HolePunch.CONNECT, addrs))
            reply = await read_dcutr_msg(stream, HolePunch)
            if reply.type != HolePunch.CONNECT:
                return False
            await write_delimited_msg(stream, _message(HolePunch.SYNC, []))
        await trio.sleep(DIAL_GRACE_S)
        return True
    finally:
        with trio.move_on_after(1):
            await stream.reset()


async def punch_from(identity: Identity, relay_addr: str, peer_id: str, addrs: list[str], tally: dict) -> None:
    """RECONNECTS circuits to the peer with one identity, each carrying up to PUNCH_SESSIONS sessions."""
    tally["identities_used"] += 1
    for _ in range(RECONNECTS):
        async with open_host(attacker_config(identity)) as host:
            await host.connect(relay_addr)
            try:
                await host.connect(f"{relay_addr}/p2p-circuit/p2p/{peer_id}")
            except Exception:  # noqa: BLE001 - HostError: the relay refused the circuit
                tally["circuits_refused"] += 1
                continue
            tally["circuits"] += 1
            await _sessions(host, peer_id, addrs, tally)


async def _sessions(host: P2PHost, peer_id: str, addrs: list[str], tally: dict) -> None:
    """Up to PUNCH_SESSIONS sessions on one circuit; after a refusal, the next waits for the peer's punch under way
    to end (it answers one session at a time); two refusals in a row end the circuit's turn."""
    refused_in_a_row = 0
    for _ in range(PUNCH_SESSIONS):
        try:
            answered = await punch_session(host, peer_id, addrs)
        except Exception:  # noqa: BLE001 - the peer reset the stream or the circuit: refused
            answered = False
        tally["sessions_answered" if answered else "sessions_refused"] += 1
        refused_in_a_row = 0 if answered else refused_in_a_row + 1
        if refused_in_a_row == 2:
            return
        if not answered:
            await trio.sleep(SESSION_TIMEOUT_S)


async def hole_punches(private: Target, relay_addr: str, relay_died: Callable[[], bool], identities: list[Identity],
                       args: argparse.Namespace) -> dict:
    """The attack against `private`, reached through the relay at `relay_addr`, measured over the attack."""
    meter, third = Meter(private.pid), ThirdParty()
    tally = {"identities_used": 0, "circuits": 0, "circuits_refused": 0, "sessions_answered": 0,
             "sessions_refused": 0}
    async with trio.open_nursery() as nursery:
        await nursery.start(third.serve)
        meter.start()
        nursery.start_soon(sample_until_cancelled, meter)
        addrs = third.addrs * 2  # each listener named twice: past any cap that keeps the first few
        with trio.move_on_after(args.seconds):
            await in_lanes(identities, max(args.parallel, len(identities) // 4),
                           lambda i: punch_from(i, relay_addr, private.peer_id, addrs, tally))
        await trio.sleep(DIAL_GRACE_S)
        meter.stop()
        nursery.cancel_scope.cancel()
    return {**meter.result(), **tally, "third_party_connections": third.connections,
            "third_party_per_identity": round(third.connections / max(1, tally["identities_used"]), 2),
            "peer_died": meter.died or not private.alive() or relay_died()}


ROOMY_RELAY = RelayLimits(max_reservations=1024, max_circuits_per_peer=1 << 20)
"""The bench's own relay: room for every circuit the attackers open, so what bounds their punches is the private
peer's, not the relay's (`--punch-relay peer` uses a `swarm peer start` relay with the defaults instead)."""


async def _with_bench_relay(work: Path, run: str, identities: list[Identity], args: argparse.Namespace) -> dict:
    config = HostConfig(identity=Identity.generate(), listen=("/ip4/127.0.0.1/tcp/0",),
                        reach=ReachConfig(mode="public", hole_punch=False, relay=ROOMY_RELAY))
    async with open_host(config) as relay:
        private = await trio.to_thread.run_sync(start_peer, work, "private", run, "--set", "reach.mode=private",
                                                "--bootstrap", relay.multiaddrs[0])
        try:
            return await hole_punches(private, relay.multiaddrs[0], lambda: False, identities, args)
        finally:
            await trio.to_thread.run_sync(private.proc.stop)


def run_hole_punches(work: Path, run: str, n: int, args: argparse.Namespace) -> dict:
    """A private `swarm peer start` holding a reservation on a relay (the bench's own by default, else a public
    `swarm peer start`); the attack on the private one."""
    if args.punch_relay == "bench":
        return {**trio.run(_with_bench_relay, work, run, fresh_identities(n), args), "relay": "bench"}
    relay = start_peer(work, "relay", run, "--set", "reach.mode=public")
    try:
        private = start_peer(work, "private", run, "--set", "reach.mode=private", "--bootstrap", relay.addr)
        try:
            result = trio.run(hole_punches, private, relay.addr, lambda: not relay.alive(), fresh_identities(n), args)
        finally:
            private.proc.stop()
    finally:
        relay.proc.stop()
    return {**result, "relay": "peer"}
