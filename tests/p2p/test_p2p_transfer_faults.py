"""Faults stay where they happen: an unexpected error in one link, or one peer's data-channel task, costs that link
or that peer, never the service, the mirror or the node; and a full budget of unverified input drops the link that
asked for more, not the node."""

from __future__ import annotations

import trio
import trio.testing

from p2p.budget import MemoryBudget
from p2p.channel.messages import HandshakeBreach
from p2p.errors import ChannelError
from p2p.identity import Identity
from p2p.pieces.store import PieceStore
from p2p.pieces.transfer import TransferConfig
from swarm.policy.mirror import PolicyMirror
from swarm.policy.trust import TrainerTrust
from tests.p2p.test_p2p_transfer import MB, Cluster, make_policy
from tests.swarm.test_swarm_mirror import signed_version


async def test_an_arbitrary_exception_in_one_links_handling_costs_that_link_only(tmp_path, autojump_clock,
                                                                                   monkeypatch):
    manifest = make_policy(tmp_path / "src", 1 * MB)
    async with trio.open_nursery() as nursery:
        c = Cluster(tmp_path, nursery, manifest, tmp_path / "src")
        seed = await c.add("seed", seed_from=tmp_path / "src")
        real_request = seed.engine.peer_request

        def buggy_request(peer, index, now):  # a bug, or input nobody foresaw, while handling one peer
            if peer == "victim":
                raise RuntimeError("injected fault")
            return real_request(peer, index, now)

        monkeypatch.setattr(seed.engine, "peer_request", buggy_request)
        await c.add("victim")
        good = await c.add("good")
        c.link("seed", "victim")
        c.link("seed", "good")
        with trio.fail_after(60):
            await good.completed.wait()
        assert "unexpectedly (RuntimeError)" in seed.drops["victim"]
        assert "victim" not in seed.banned  # our bug is no proof of a breach: the peer may come back
        assert not seed._stopped  # the service, and the node around it, are still serving
        nursery.cancel_scope.cancel()
    c.assert_identical("good")
    c.close()


async def test_a_full_budget_drops_the_link_that_asks_for_more_not_the_service(tmp_path, autojump_clock):
    manifest = make_policy(tmp_path / "src", 1 * MB)
    async with trio.open_nursery() as nursery:
        c = Cluster(tmp_path, nursery, manifest, tmp_path / "src")
        await c.add("seed", seed_from=tmp_path / "src")
        starved = await c.add("starved")
        starved._budget = MemoryBudget(1024)  # less than one piece frame: every piece frame is refused
        c.link("seed", "starved")
        with trio.fail_after(30):
            while "seed" not in starved.drops:
                await trio.sleep(0.1)
        assert "unverified input" in starved.drops["seed"] and "seed" not in starved.banned
        assert starved._budget.held == 0 and starved._budget.refused >= 1  # the link's lease went with it
        nursery.cancel_scope.cancel()
    c.close()


def _mirror(tmp_path, store, key):
    return PolicyMirror(store, "m", TrainerTrust("r", key.public_bytes, tmp_path), run="r",
                        transfer=TransferConfig(), copies_dir=tmp_path / "policies")


async def test_a_dial_raising_anything_costs_that_peer_and_a_handshake_breach_bans_it(tmp_path, autojump_clock):
    """A wrong-typed field in a peer's offer raises deep in the dialer: it must cost that peer, not the mirror's
    nursery and with it the node."""
    key = Identity.generate()
    with PieceStore(tmp_path / "store") as store:
        mirror = _mirror(tmp_path, store, key)
        async with trio.open_nursery() as nursery:
            await nursery.start(mirror.run_service)
            mirror.adopt(signed_version(tmp_path, key, 0))
            opened = []

            async def dial(peer):
                if peer == "z-buggy":
                    raise TypeError("unhashable type: 'list'")
                if peer == "z-liar":
                    raise HandshakeBreach("data channel offer names its cipher in a malformed way")
                ours, theirs = trio.testing.memory_stream_pair()
                opened.append((peer, theirs))
                return ours

            await mirror.reconcile(["z-buggy", "z-liar", "z-honest"], dial, max_links=8)
            await trio.sleep(1.0)
            assert "z-liar" in mirror.banned and "z-buggy" not in mirror.banned
            assert {peer for peer, _ in opened} == {"z-honest"}  # its link (and spare) went ahead
            await trio.sleep(3.0)  # past the back-off: the buggy peer is tried again, the banned one never
            await mirror.reconcile(["z-buggy", "z-liar", "z-honest"], dial, max_links=8)
            await trio.sleep(1.0)
            assert "z-liar" in mirror.banned
            nursery.cancel_scope.cancel()


async def test_spare_dials_to_a_peer_that_never_accepts_one_back_off(tmp_path, autojump_clock):
    """Each spare dial to a peer without the data protocol costs a stream and a negotiation: fresh identities that
    never accept one cost a few dials a minute each (2, 4, 8, 16, then 30 s apart), not one every 2 s."""
    key = Identity.generate()
    dials = []

    async def dial(peer):
        dials.append(peer)
        raise ChannelError("protocol not supported")

    with PieceStore(tmp_path / "store") as store:
        mirror = _mirror(tmp_path, store, key)
        async with trio.open_nursery() as nursery:
            await nursery.start(mirror.run_service)
            for _ in range(240):  # a minute of the node's reconcile loop
                await mirror.reconcile(["z-stranger"], dial, max_links=8)
                await trio.sleep(0.25)
            nursery.cancel_scope.cancel()
    assert 4 <= len(dials) <= 6
