"""A crowd of link squatters against real hosts on loopback: identities connected before each version appears that
link to every peer for it, claim to hold no piece and never send one, must not keep any honest peer from its copy."""

from __future__ import annotations

import math
from contextlib import AsyncExitStack

import trio

from p2p.identity import Identity
from swarm.policy.link_places import LINK_IDLE_AFTER
from tests.swarm.link_squatters import crowd_process, honest_peer, signed_policy

SQUATTERS = 40
HONEST = 3
VERSION_BYTES = 8 << 20  # 32 pieces: about a second to spread on loopback without the crowd, as in the attack


async def publish(tmp, key, version, publisher, honest, crowd, deadline: float = 60.0) -> list[float]:
    """Publish a version as the trainer does (gossip reaches every peer at once here), with the crowd (if any)
    linking the moment it appears; seconds each honest peer took to hold it (inf: not within `deadline`)."""
    signed, directory = signed_policy(tmp / "versions", key, version, VERSION_BYTES)
    started = trio.current_time()
    publisher.mirror.adopt(signed, local_dir=directory)
    took = [math.inf] * len(honest)

    async def wait(i, followed) -> None:
        await followed.service.completed.wait()
        took[i] = trio.current_time() - started

    async with trio.open_nursery() as waits:
        if crowd is not None:  # told at once, its answer not awaited: the crowd links while the peers fetch
            waits.start_soon(crowd.command, f"squat {signed.hex()}")
        with trio.move_on_after(deadline):
            async with trio.open_nursery() as fetching:
                for i, peer in enumerate(honest):
                    fetching.start_soon(wait, i, peer.mirror.adopt(signed))
    return took


async def test_a_crowd_of_squatters_keeps_no_honest_peer_from_any_version(tmp_path):
    """Version 0 spreads without the crowd (a long-lived trainer's peers have served each other before), versions 1
    and 2 measure the time without it; then the crowd connects, and versions 3 to 5 must each reach every honest
    peer within 3x the slowest time without it, with a floor of 3 s: the four honest peers share one process, which
    also accepts every channel the crowd opens, on a machine whose load varies by seconds (a version without the
    crowd now and then takes 5 s here too). Before links gave their places up, no version reached any of them. Each
    peer lets in a burst of 64 new peers at once (p2p.host.inbound_admission), so the whole crowd gets in."""
    key = Identity.generate()
    async with AsyncExitStack() as stack:
        publisher = await stack.enter_async_context(honest_peer(tmp_path / "pub", key, identity=key))
        honest = [await stack.enter_async_context(honest_peer(tmp_path / f"h{i}", key)) for i in range(HONEST)]
        everyone = [publisher, *honest]
        for i, peer in enumerate(everyone):
            for other in everyone[i + 1:]:
                await peer.host.connect(other.host.multiaddrs[0])
        quiet = [await publish(tmp_path, key, version, publisher, honest, None) for version in (0, 1, 2)]
        bound = 3 * max(3.0, *quiet[1], *quiet[2])
        crowd = await stack.enter_async_context(crowd_process(SQUATTERS))
        for peer in everyone:
            await crowd.command(f"connect {peer.host.multiaddrs[0]}")
        await trio.sleep(2 * LINK_IDLE_AFTER)  # connected well before the version appears, around a long-lived trainer
        attacked = [await publish(tmp_path, key, version, publisher, honest, crowd, bound) for version in (3, 4, 5)]
        print(f"without the crowd {quiet[1:]}, with {SQUATTERS} squatters {attacked}")
        assert all(took <= bound for version in attacked for took in version), (quiet, attacked)
