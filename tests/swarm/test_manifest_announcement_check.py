"""Announced manifests are verified before gossip forwards them (swarm.messages.gossip_bodies.run_decoders, with
swarm.messages.manifest_check): a forged signature, a manifest of another id or version, or another signer is
refused by the validator, and never forwarded; the checks cost the node a bounded amount whatever the number of
forging identities, and the trainer's own announcements pass through a flood of forgeries."""

from __future__ import annotations

from contextlib import AsyncExitStack
from types import SimpleNamespace

import blake3
import pytest
import trio

from p2p.errors import EnvelopeError
from p2p.gossip.envelope import seal
from p2p.gossip.service import open_gossip, topic_for
from p2p.host.p2p_host import HostConfig, open_host
from p2p.identity import Identity
from p2p.pieces.manifest import SIG_CONTEXT, SignedManifest
from swarm.bench.fuzz_targets import sample_manifest
from swarm.messages.gossip_bodies import DECODERS, run_decoders
from swarm.messages.manifest_check import ManifestCheckConfig, ManifestSignatures

TRAINER = Identity(bytes([90]) * 32)
RUN = "run-manifest-check"
LIMIT = 30


def signed(manifest_bytes: bytes, key: Identity = TRAINER, forged: bool = False) -> bytes:
    signature = key.sign(SIG_CONTEXT + blake3.blake3(manifest_bytes).digest())
    if forged:
        signature = bytes([signature[0] ^ 1]) + signature[1:]
    return SignedManifest(manifest_bytes, key.public_bytes, signature).to_bytes()


def announcement(wrapper: bytes, manifest_id: bytes | None = None, version: int = 3) -> dict:
    return {"id": manifest_id or sample_manifest().id, "version": version, "signed": wrapper}


def env(body: dict, sender: Identity) -> SimpleNamespace:
    return SimpleNamespace(body=body, sender=sender.public_bytes, sender_peer_id=sender.peer_id)


def refusal(decode, body: dict, sender: Identity) -> str | None:
    try:
        decode(env(body, sender))
    except EnvelopeError as exc:
        return exc.reason
    return None


MANIFEST = sample_manifest().encode()


def test_an_announced_manifest_must_verify_against_the_trainer_key_before_it_is_accepted():
    decode = run_decoders(lambda: TRAINER.public_bytes, now=lambda: 0.0)["manifest"]
    relay = Identity(bytes([91]) * 32)
    assert refusal(decode, announcement(signed(MANIFEST)), TRAINER) is None
    assert refusal(decode, announcement(signed(MANIFEST)), relay) is None  # a relayed copy of the real one
    assert refusal(decode, announcement(signed(MANIFEST, forged=True)), relay) == "bad_body"
    assert refusal(decode, announcement(signed(MANIFEST, forged=True)), TRAINER) == "bad_body"
    assert refusal(decode, announcement(signed(MANIFEST, key=relay)), relay) == "bad_body"  # another signer
    assert refusal(decode, announcement(signed(MANIFEST), manifest_id=bytes(32)), relay) == "bad_body"
    assert refusal(decode, announcement(signed(MANIFEST), version=4), relay) == "bad_body"
    assert refusal(decode, announcement(b"\x93junk"), relay) == "bad_body"
    assert refusal(decode, {"id": bytes(32), "version": 1}, relay) is None  # by id: fetched and verified later


def test_before_a_key_is_pinned_a_manifest_must_verify_against_the_key_it_names():
    decode = run_decoders(lambda: None, now=lambda: 0.0)["manifest"]
    stranger = Identity(bytes([92]) * 32)
    assert refusal(decode, announcement(signed(MANIFEST, key=stranger)), stranger) is None
    assert refusal(decode, announcement(signed(MANIFEST, key=stranger, forged=True)), stranger) == "bad_body"


def test_a_crowd_of_forgers_costs_a_bounded_number_of_checks_and_the_trainer_still_gets_through():
    config = ManifestCheckConfig(verifications_per_s=2.0, burst=8.0)
    clock = [0.0]
    checks = ManifestSignatures(config)
    decode = run_decoders(lambda: TRAINER.public_bytes, now=lambda: clock[0], signatures=checks)["manifest"]
    reasons = []
    for i in range(1000):  # 1,000 fresh identities, one forgery each, all within one second
        forger = Identity(i.to_bytes(2, "big") * 16)
        clock[0] = i / 1000
        reasons.append(refusal(decode, announcement(signed(MANIFEST, forged=True)), forger))
    assert checks.verifications <= config.burst + config.verifications_per_s
    assert set(reasons) == {"bad_body", "node_busy"} and reasons.count("bad_body") == checks.verifications
    assert refusal(decode, announcement(signed(MANIFEST)), TRAINER) is None  # the trainer's own, in the flood
    before = checks.verifications
    for i in range(50):  # relayed copies of a verified manifest are checked once
        assert refusal(decode, announcement(signed(MANIFEST)), Identity(bytes([i + 1]) * 32)) is None
    assert checks.verifications == before


@pytest.mark.parametrize("forged", [True, False])
async def test_a_forged_trainer_manifest_is_refused_by_the_relay_and_never_forwarded(forged):
    """Line mallory - target - witness on loopback: mallory announces a manifest claiming the trainer's key."""
    with trio.fail_after(LIMIT):
        async with AsyncExitStack() as stack:
            gossips = []
            for i, decoders in enumerate([DECODERS, run_decoders(lambda: TRAINER.public_bytes), DECODERS]):
                host = await stack.enter_async_context(open_host(HostConfig(identity=Identity(bytes([93 + i]) * 32))))
                gossips.append(await stack.enter_async_context(
                    open_gossip(host, RUN, kinds=tuple(DECODERS), decoders=decoders)))
            mallory, target, witness = gossips
            for left, right in ((mallory, target), (target, witness)):
                await left.host.connect(right.host.multiaddrs[0])
                await left.wait_for_mesh(right.host.peer_id, "manifest")
                await right.wait_for_mesh(left.host.peer_id, "manifest")
            heard = witness.subscribe("manifest")
            body = announcement(signed(MANIFEST, forged=forged))
            data = seal("manifest", RUN, body, mallory.identity, mallory.clock(), 1)
            await mallory.pubsub.publish(topic_for(RUN, "manifest"), data)
            with trio.move_on_after(3.0):
                forwarded = await heard.receive()
                assert not forged and forwarded.message.signed == body["signed"]
                return
            assert forged
            assert target.stats.rejected["bad_body"] == 1

