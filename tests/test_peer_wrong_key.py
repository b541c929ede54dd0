"""Two whole peers on loopback: one pinned to a key the run's trainer does not hold refuses its manifests with one
line naming both keys, and gives up with status 1 after wrong_key_timeout_s."""

import trio

from p2p.identity import Identity
from swarm.events import EventSink
from swarm.node.node import open_node_parts
from tests.test_swarm_nodes import Peer, signed_checkpoint, start_seeding


async def test_a_peer_with_a_wrong_trainer_key_says_which_keys_once_then_exits_1(tmp_path):
    trainer, pinned = Identity.generate(), Identity.generate()
    _, _, signed = signed_checkpoint(tmp_path, trainer, floats=1000)
    joiner = Peer(tmp_path, "joiner", pinned, wrong_key_timeout_s=2.0)
    sink = EventSink(stream=open("/dev/null", "w"))
    sink.listeners.append(lambda e: joiner.events.append(e.record()))
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            seed = await start_seeding(nursery, tmp_path, trainer, signed)
            joiner.config = joiner.config.model_copy(update={"peer": joiner.config.peer.model_copy(
                update={"bootstrap": tuple(seed.node.host.multiaddrs[:1])})})
            status = await open_node_parts(joiner.config, joiner.identity, sink, [], pinned.public_bytes)
            seed.stop()
    assert status == 1
    refused = [e for e in joiner.events if e["event"] == "refused"]
    assert len(refused) == 1, refused  # within the minute: one line however many manifests came
    assert trainer.peer_id in refused[0]["reason"] and pinned.peer_id in refused[0]["reason"]
    assert joiner.events[-1]["event"] == "trainer_key_gave_up"
