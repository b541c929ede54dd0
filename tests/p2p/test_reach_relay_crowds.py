"""A crowd of identities against a relay: what it holds is bounded node-wide and released when it leaves.

The decisions (p2p.reach.relay_guard) on their own, then real hosts on loopback, where py-libp2p keeps the
reservations and circuits."""

from __future__ import annotations

import secrets

import trio
from libp2p.relay.circuit_v2.pb.circuit_pb2 import HopMessage
from libp2p.relay.circuit_v2.protocol import PROTOCOL_ID
from libp2p.relay.circuit_v2.protocol_buffer import StatusCode, to_proto_status
from libp2p.relay.circuit_v2.utils import read_delimited_msg, write_delimited_msg

from p2p.host.p2p_host import HostConfig, open_host
from p2p.reach.probe import ReachConfig
from p2p.reach.relay_guard import RESERVATION_GRACE_S, RelayGuard
from p2p.reach.relay_limits import RelayLimits

OK = to_proto_status(StatusCode.OK)


def test_reservations_are_capped_in_all_and_per_ip_and_one_holder_renews_its_own():
    guard = RelayGuard(RelayLimits(max_reservations=4, max_reservations_per_ip=2))
    assert guard.admit_reservation("a", "10.0.0.1") and guard.admit_reservation("b", "10.0.0.1")
    assert not guard.admit_reservation("c", "10.0.0.1")  # a third id from the same address
    assert guard.admit_reservation("a", "10.0.0.1")  # renewing takes no new place
    assert guard.admit_reservation("c", "2001:db8::1") and guard.admit_reservation("d", "2001:db8::2:3")
    assert not guard.admit_reservation("e", "2001:db8::ffff:1")  # the same /64: the same party
    assert not guard.admit_reservation("e", "10.0.0.4")  # full, whatever the address
    assert sorted(guard.holders) == ["a", "b", "c", "d"]


def test_a_reservation_goes_a_short_grace_after_its_holder_left_and_a_reconnect_within_it_keeps_it():
    guard = RelayGuard(RelayLimits(max_reservations=2))
    assert guard.admit_reservation("a", "10.0.0.1") and guard.admit_reservation("b", "10.0.0.2")
    assert guard.sweep({"a", "b"}, 0.0) == []
    assert guard.sweep({"b"}, 1.0) == []  # "a" left: its grace starts
    assert guard.sweep({"a", "b"}, 2.0) == []  # and it came back in time
    assert guard.sweep({"b"}, 3.0) == [] and guard.sweep({"b"}, 3.0 + RESERVATION_GRACE_S) == ["a"]
    assert guard.admit_reservation("c", "10.0.0.3")  # its place is free


def test_circuits_are_capped_per_destination_per_source_in_all_and_per_second():
    limits = RelayLimits(max_circuits_per_peer=3, max_circuits=5, circuits_per_s=2.0)
    guard = RelayGuard(limits)
    opened = [guard.open_circuit(f"src{i}", f"10.0.0.{i}", "dst", 0.0) for i in range(5)]
    assert opened == [True, True, True, False, False]  # per destination, however many sources
    guard = RelayGuard(limits)
    assert [guard.open_circuit("src", "10.0.0.1", f"dst{i}", 10.0 + i) for i in range(4)] == [True] * 3 + [False]
    guard = RelayGuard(limits)  # fresh ids from one IPv6 /64
    assert [guard.open_circuit(f"s{i}", f"2001:db8::{i}", f"d{i}", 10.0 + i) for i in range(4)] == [True] * 3 + [False]
    guard = RelayGuard(limits)
    assert sum(guard.open_circuit(f"s{i}", f"10.0.0.{i}", f"d{i}", 100.0 + i) for i in range(10)) == 5
    guard.close_circuit("s0", "10.0.0.0", "d0")
    assert guard.open_circuit("s9", "10.0.0.9", "d9", 200.0) and guard.circuits == limits.max_circuits
    guard = RelayGuard(RelayLimits(max_circuits=100, circuits_per_s=2.0))  # 1,000 ids at one instant: the burst
    assert sum(guard.open_circuit(f"s{i}", f"10.0.{i >> 8}.{i & 255}", f"d{i}", 0.0) for i in range(1000)) == 8


def test_one_address_opening_and_closing_circuits_cannot_spend_the_relays_whole_circuit_rate():
    """Circuits that end at once never meet the caps on open circuits, so only the rate bounds them: one address
    (any number of ids, to a destination of its own) spends at most its share, and others' circuits still open."""
    limits = RelayLimits()
    guard = RelayGuard(limits)
    hostile = 0
    for tick in range(600):  # a minute of requests every 100 ms, each circuit closed as soon as it opens
        now = tick / 10
        for i in range(8):
            if guard.open_circuit(f"crowd{tick}-{i}", "203.0.113.9", "crowd-dst", now):
                guard.close_circuit(f"crowd{tick}-{i}", "203.0.113.9", "crowd-dst")
                hostile += 1
        if tick % 10 == 5:
            assert guard.open_circuit(f"honest{tick}", f"198.51.100.{tick // 10}", "private", now)
            guard.close_circuit(f"honest{tick}", f"198.51.100.{tick // 10}", "private")
    assert hostile <= 60 * limits.circuits_per_s / 2


async def _hop(host, relay_id: str, msg: HopMessage) -> HopMessage | None:
    """The relay's answer to `msg`, or None when it reset the stream instead."""
    stream = await host.new_stream(relay_id, PROTOCOL_ID)
    await write_delimited_msg(stream, msg)
    with trio.fail_after(10):
        try:
            return await read_delimited_msg(stream, HopMessage)
        except Exception:  # noqa: BLE001 - a reset: no answer
            return None


def _relay_config(**limits) -> HostConfig:
    return HostConfig(reach=ReachConfig(mode="public", relay=RelayLimits(**limits)))


def _private(relay) -> HostConfig:
    return HostConfig(bootstrap=(relay.multiaddrs[0],), reach=ReachConfig(mode="private", hole_punch=False))


async def test_one_identity_reserves_for_itself_only_whatever_ids_its_messages_name():
    async with open_host(_relay_config(max_reservations=4)) as relay, \
            open_host(HostConfig(bootstrap=(relay.multiaddrs[0],), reach=ReachConfig(mode="public"))) as crowd:
        for _ in range(6):
            msg = HopMessage(type=HopMessage.RESERVE)
            msg.peer.id = secrets.token_bytes(34)  # a made-up id
            await _hop(crowd, relay.peer_id, msg)
        table = relay.reach.relaying.protocol.resource_manager._reservations
        assert [str(p) for p in table] == [crowd.peer_id]


async def test_reservations_of_a_crowd_that_left_are_free_again_within_seconds():
    """A crowd takes every place and disconnects: an honest private peer reserves a few seconds later."""
    async with open_host(_relay_config(max_reservations=3, max_reservations_per_ip=8)) as relay:
        for _ in range(3):
            async with open_host(_private(relay)) as attacker:
                assert attacker.reach.relayed_addrs
                await attacker.disconnect(relay.peer_id)
        async with open_host(_private(relay)) as refused:
            assert refused.reach.relayed_addrs == []  # the crowd's places are taken while their grace runs
            await refused.disconnect(relay.peer_id)
        left = trio.current_time()
        with trio.fail_after(RESERVATION_GRACE_S + 8):
            while True:
                async with open_host(_private(relay)) as honest:
                    if honest.reach.relayed_addrs:
                        break
                    await honest.disconnect(relay.peer_id)
        assert trio.current_time() - left < RESERVATION_GRACE_S + 8


async def test_circuits_asked_for_at_once_keep_to_the_per_peer_cap():
    """Circuits to one reserved peer asked for together: py-libp2p counts each only once it is up, so every one of
    them passed its check; counted from the request, the cap holds."""
    cap = 3
    async with open_host(_relay_config(max_circuits_per_peer=cap)) as relay, \
            open_host(_private(relay)) as target, \
            open_host(HostConfig(bootstrap=(relay.multiaddrs[0],), reach=ReachConfig(mode="public"))) as crowd:
        assert target.reach.relayed_addrs
        answers: list[HopMessage | None] = []

        async def connect() -> None:
            msg = HopMessage(type=HopMessage.CONNECT)
            msg.peer.id = target.libp2p.get_id().to_bytes()
            answers.append(await _hop(crowd, relay.peer_id, msg))

        with trio.fail_after(30):
            async with trio.open_nursery() as nursery:
                for _ in range(3 * cap):
                    nursery.start_soon(connect)
        opened = sum(answer is not None and answer.status == OK for answer in answers)
        assert 0 < opened <= cap and relay.reach.relaying.protocol.guard.circuits == opened


async def test_circuits_asked_for_peers_without_a_reservation_spend_none_of_the_relays_circuit_rate():
    async with open_host(_relay_config()) as relay, open_host(_private(relay)) as target, \
            open_host(HostConfig(bootstrap=(relay.multiaddrs[0],), reach=ReachConfig(mode="public"))) as crowd:
        bogus = HopMessage(type=HopMessage.CONNECT)
        bogus.peer.id = secrets.token_bytes(34)
        with trio.fail_after(30):
            async with trio.open_nursery() as nursery:
                for _ in range(40):  # past the rate's burst of 16
                    nursery.start_soon(_hop, crowd, relay.peer_id, bogus)
        real = HopMessage(type=HopMessage.CONNECT)
        real.peer.id = target.libp2p.get_id().to_bytes()
        answer = await _hop(crowd, relay.peer_id, real)
        assert answer is not None and answer.status == OK


async def test_a_circuit_ends_when_its_source_leaves_and_gives_its_place_back():
    """py-libp2p stops relaying one direction when its source is gone but keeps reading the other, from a
    destination that has nothing to say: the circuit held its place for good, so a crowd opening circuits and
    leaving would fill the relay's circuits and a private peer's for good."""
    async with open_host(_relay_config()) as relay, open_host(_private(relay)) as target:
        guard = relay.reach.relaying.protocol.guard
        async with open_host(HostConfig(reach=ReachConfig(mode="public", hole_punch=False))) as crowd:
            await crowd.connect(target.multiaddrs[0])
            await trio.sleep(1)  # the connection settles (identify runs over it both ways)
            assert guard.circuits == 1
            await crowd.disconnect(relay.peer_id)
        with trio.fail_after(10):
            while guard.circuits:
                await trio.sleep(0.2)
        assert not relay.reach.relaying.protocol._active_relays  # py-libp2p's table of circuits keeps none of it
        with trio.fail_after(10):  # the destination's relayed connection to the crowd ends with it
            while crowd.peer_id in {str(p) for p in target.libp2p.get_connected_peers()}:
                await trio.sleep(0.2)


def test_a_peer_accepts_relayed_connections_only_through_its_relays_and_at_a_node_wide_rate():
    from p2p.reach.relay_guard import STOP_BURST, CircuitAcceptor

    acceptor = CircuitAcceptor()
    assert not acceptor.accept("stranger", {"relay"}, 0.0)  # a peer we hold no reservation with is no relay of ours
    assert sum(acceptor.accept("relay", {"relay"}, 0.0) for _ in range(1000)) == STOP_BURST


async def test_a_stranger_cannot_open_relayed_connections_to_a_peer_that_holds_no_reservation_with_it():
    """Every host serves STOP: each STOP CONNECT makes it build a whole libp2p connection (Noise, Yamux, identify)
    for a source id the sender names, as many as it sends on one connection."""
    from libp2p.relay.circuit_v2.pb.circuit_pb2 import StopMessage
    from libp2p.relay.circuit_v2.protocol import STOP_PROTOCOL_ID

    async with open_host(HostConfig(reach=ReachConfig(mode="public"))) as public, \
            open_host(HostConfig(bootstrap=(public.multiaddrs[0],), reach=ReachConfig(mode="public"))) as stranger:
        answers = []
        for _ in range(4):
            msg = StopMessage(type=StopMessage.CONNECT)
            msg.peer.id = secrets.token_bytes(34)
            with trio.fail_after(10):
                try:
                    stream = await stranger.new_stream(public.peer_id, STOP_PROTOCOL_ID)
                    await write_delimited_msg(stream, msg)
                    answers.append((await read_delimited_msg(stream, StopMessage)).status)
                except Exception:  # noqa: BLE001 - reset: refused
                    answers.append(None)
        assert answers == [None] * 4


async def test_a_circuit_that_ends_leaves_the_other_circuits_to_its_destination_open():
    """py-libp2p files each circuit under its ends' peer ids, one entry per id, and a circuit that ends closes the
    entry's streams: those of the last circuit filed under the same destination (or source) id, whoever holds it.
    A crowd opening and closing circuits to a peer would cut an honest peer's circuit to it each time."""
    echo = "/test/echo/1"

    async def reply(stream) -> None:
        await stream.write(await stream.read(64))
        await stream.close()

    async with open_host(_relay_config()) as relay, open_host(_private(relay)) as target:
        target.set_guarded_handler(echo, reply)
        guard = relay.reach.relaying.protocol.guard
        circuit = f"{relay.multiaddrs[0]}/p2p-circuit/p2p/{target.peer_id}"
        public = HostConfig(reach=ReachConfig(mode="public", hole_punch=False))
        async with open_host(public) as honest:
            async with open_host(public) as crowd:
                await crowd.connect(circuit)
                await honest.connect(circuit)  # filed after the crowd's
                with trio.fail_after(10):
                    while guard.circuits < 2:
                        await trio.sleep(0.1)
            with trio.fail_after(10):  # the crowd's host closed: its circuit ends
                while guard.circuits > 1:
                    await trio.sleep(0.1)
            with trio.fail_after(10):
                stream = await honest.new_stream(target.peer_id, echo)
                await stream.write(b"still here")
                assert await stream.read(64) == b"still here"
