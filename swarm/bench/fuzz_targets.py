"""The registry of fuzz targets: every decoder of network input, with valid samples and the errors it may raise.

One table serves the property tests (tests/bench/test_fuzz_decoders.py, hypothesis) and `swarm bench fuzz` (seeded
random mutations for as long as asked), so a decoder added here is fuzzed by both. The property each target must
hold: for any input, its decoder returns a value or raises one of `expected`; anything else (a TypeError from a
field of the wrong type, a RecursionError, an OverflowError) is a finding, because the caller that catches only
the project's own errors ends the role or the node that received the input.

Decoders that take a gossip body receive it the way a handler does: the fuzzed bytes are a msgpack body, sealed
into a real envelope and opened again (p2p.gossip.envelope), so bodies the envelope refuses count as refused and the
rest arrive in the form handlers see. Gossip bodies are fuzzed twice: through the typed decoder gossip's validator
runs before delivery or forwarding (swarm.messages.gossip_bodies), and through the readers of the roles that receive
them (swarm.messages.votes, swarm.messages.rollout_codec). What arrives on streams (piece frames, the data channel's
handshake,
records and the link preamble) has its decoders in swarm.bench.fuzz_stream_targets. Samples are built in memory,
deterministically, without disk or network.
"""

from __future__ import annotations

import functools
import zlib
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import blake3
import msgpack

from p2p.errors import ChannelError, DHTError, EnvelopeError, FrameError, ManifestError
from p2p.identity import Identity
from p2p.packed import Packed
from p2p.pieces.manifest import (
    MIN_PIECE_SIZE,
    SIG_CONTEXT,
    FileEntry,
    GenerationSettings,
    PatchRef,
    PolicyManifest,
    SignedManifest,
    TensorEntry,
    VerifiedManifest,
    decode_manifest,
    open_signed_manifest,
)
from p2p.pieces.manifest_decode import MAX_MODEL_DEPTH, _is_plain_tree
from swarm.bench import fuzz_patch_targets as patch
from swarm.bench import fuzz_stream_targets as stream
from swarm.errors import UserError
from swarm.messages.rollout_codec import Announcement, RolloutRefused, decode_blob, parse_items
from swarm.messages.votes import votes_in
from verify.rollout import Completion, RolloutGroup, RolloutSchemaError
from verify.votes import sign_vote, verify_vote

if TYPE_CHECKING:  # imported where used, inside the decoders, like every module a decoder alone needs
    from p2p.dht.service import LatestManifest
    from p2p.gossip.envelope import Envelope

RUN = "fuzz-run"
NOW = 1_700_000_000.0
SENDER = Identity(bytes(range(32)))
"""The fixed key that seals every sample (and every fuzzed body), so a run is reproducible from its inputs."""


@dataclass(frozen=True)
class FuzzTarget:
    """One decoder of network input under fuzzing."""

    name: str
    """Short name, shown in reports and used to pick targets on the command line."""
    decode: Callable[[bytes], object]
    """Takes the raw input; returns a typed value (whichever: only that it returns is checked) or raises one of
    `expected`."""
    samples: Callable[[], list[bytes]]
    """Valid encodings the mutations start from (built once, on first use)."""
    expected: tuple[type[BaseException], ...]
    """The only exception types the decoder may raise on hostile input."""
    frame_prefix: int = 0
    """Bytes of framing before the msgpack payload of each sample (kept out of tree edits)."""


def _cached(build: Callable[[], list[bytes]]) -> Callable[[], list[bytes]]:
    return functools.cache(build)


# ---------------------------------------------------------------------------------------------- gossip bodies


def _envelope_of(data: bytes, kind: str) -> Envelope:
    """The opened envelope a `kind` handler receives for the fuzzed msgpack body `data`, or EnvelopeError as the
    envelope would raise it."""
    from p2p.gossip.envelope import open_envelope, seal

    try:
        body = msgpack.unpackb(data, raw=False, strict_map_key=False)
    except Exception:  # noqa: BLE001 - bytes that are not one msgpack value: the envelope never carries them
        raise EnvelopeError("malformed", "fuzzed body is not msgpack") from None
    return open_envelope(seal(kind, RUN, body, SENDER, NOW, 1), RUN, NOW)


def _body_of(data: bytes, kind: str) -> Packed:
    return _envelope_of(data, kind).body


def _pack(value: Packed) -> bytes:
    return msgpack.packb(value, use_bin_type=True)


def decode_envelope(data: bytes) -> Envelope:
    from p2p.gossip.envelope import open_envelope

    return open_envelope(data, RUN, NOW)


@_cached
def envelope_samples() -> list[bytes]:
    from p2p.gossip.envelope import seal

    bodies = [("heartbeat", heartbeat_body()), ("vote", {"votes": [vote_wire()]}), ("rollout", {"group": group_wire()}),
              ("manifest", {"id": bytes(32)}), ("have", b"\x01\x02")]
    return [seal(kind, RUN, body, SENDER, NOW, seq) for seq, (kind, body) in enumerate(bodies)]


def heartbeat_body() -> dict:
    return {"roles": ["seed", "validator"], "addrs": [f"/ip4/127.0.0.1/tcp/4001/p2p/{SENDER.peer_id}"],
            "policies": [[3, bytes(32), True], [4, b"\x01" * 32, False]],
            "progress": {"step": 7, "reward": 0.5, "stage": "short@512"}}


def vote_wire() -> dict:
    class Check:
        def __init__(self, name: str, ok: bool, reason: str) -> None:
            self.name, self.ok, self.reason = name, ok, reason

    checks = [Check("proof", True, ""), Check("reward", False, "claimed 1.0, recomputed 0.0")]
    return sign_vote(SENDER.seed, b"\x07" * 32, False, checks).to_wire()


def decode_votes(data: bytes) -> tuple[list[bool], int]:
    votes, malformed = votes_in(_body_of(data, "vote"))
    return [verify_vote(v) for v in votes], malformed


@_cached
def vote_samples() -> list[bytes]:
    one = vote_wire()
    return [_pack({"votes": [one, one]}), _pack({"vote": one})]


# ---------------------------------------------------------------------------------------------- typed gossip bodies


def decode_gossip_heartbeat(data: bytes) -> object:
    from swarm.messages.gossip_bodies import decode_heartbeat

    return decode_heartbeat(_envelope_of(data, "heartbeat"))


def decode_heartbeat_status(data: bytes) -> str:
    """What `swarm status` makes of one heartbeat: its view's report as `--json` prints it (strict JSON: NaN or
    Infinity would break every reader) and as the terminal shows it."""
    from swarm.cli.status_view import SwarmView, render, to_json
    from swarm.messages.gossip_bodies import decode_heartbeat

    view = SwarmView()
    view.on_heartbeat(SENDER.peer_id, decode_heartbeat(_envelope_of(data, "heartbeat")), NOW)
    report = view.report(NOW, 10.0)
    render(report)
    return to_json(report)


@_cached
def heartbeat_samples() -> list[bytes]:
    return [_pack(heartbeat_body()), _pack({"roles": ["worker"]})]


def decode_gossip_manifest(data: bytes) -> object:
    """A manifest announcement as a node that knows its run's trainer key (the fuzzing key) decodes it."""
    from swarm.messages.gossip_bodies import run_decoders

    return run_decoders(lambda: SENDER.public_bytes, now=lambda: NOW)["manifest"](_envelope_of(data, "manifest"))


@_cached
def announcement_samples() -> list[bytes]:
    signed = signed_manifest_samples()[0]
    return [_pack({"id": blake3.blake3(manifest_samples()[0]).digest(), "version": 3, "signed": signed}),
            _pack({"id": b"\x04" * 32, "version": 0})]


def decode_gossip_votes(data: bytes) -> object:
    from swarm.messages.gossip_bodies import decode_votes as decode_vote_batch

    return decode_vote_batch(_envelope_of(data, "vote"))


def decode_gossip_rollouts(data: bytes) -> object:
    """Rollouts as a node decodes them: stopping at the first refused item, within the node's inflation allowance."""
    from swarm.messages.gossip_bodies import run_decoders

    return run_decoders(lambda: SENDER.public_bytes, now=lambda: NOW)["rollout"](_envelope_of(data, "rollout"))


# ---------------------------------------------------------------------------------------------- rollouts


def rollout_group(task: int = 42):
    """A valid group of the fuzzing sender; `task` names its slot (a message carries one item per slot)."""

    completions = tuple(Completion((5, 6, 7, 2), (-0.5, -1.25, -0.1, -2.0), reason, float(i), bytes([i]) * 38)
                        for i, reason in enumerate(("eos", "length")))
    return RolloutGroup(RUN, 3, b"\x09" * 32, SENDER.peer_id, 11, "basic_arithmetic", task, (1, 2, 3, 4), 0.7, 64,
                        completions)


def group_wire() -> dict:
    return rollout_group().to_wire()


def decode_rollout_body(data: bytes) -> list[RolloutGroup | Announcement | RolloutRefused]:
    return parse_items(_body_of(data, "rollout"))


@_cached
def rollout_body_samples() -> list[bytes]:
    raw, other = rollout_group().encode(), rollout_group(task=43).encode()
    return [_pack({"group": group_wire()}), _pack({"z": zlib.compress(raw), "n": len(raw)}),
            _pack({"batch": [{"group": group_wire()}, {"z": zlib.compress(other), "n": len(other)}]}),
            _pack({"ann": _announcement()})]


def _announcement() -> dict:
    raw = rollout_group().encode()
    blob = zlib.compress(raw)
    return {"id": blake3.blake3(blob).digest(), "size": len(blob), "n": len(raw), "worker": SENDER.peer_id,
            "rollout": blake3.blake3(raw).digest(), "version": 3, "run": RUN, "step": 11, "dataset": "basic_arithmetic",
            "task": 42, "addrs": [f"/ip4/127.0.0.1/tcp/4001/p2p/{SENDER.peer_id}"]}


def decode_rollout_group(data: bytes) -> RolloutGroup:
    return RolloutGroup.decode(data)


def decode_rollout_blob(data: bytes) -> RolloutGroup:
    """A compressed group as fetched by blob id: inflated under its declared size, decoded, checked canonical."""

    return decode_blob(zlib.compress(data, 1), len(data))


@_cached
def rollout_group_samples() -> list[bytes]:
    return [rollout_group().encode()]


# ---------------------------------------------------------------------------------------------- manifests


def manifest_model() -> dict:
    spec = {"task": "basic_arithmetic", "task_size": 100, "task_config": "{}", "task_seed": 0, "eval_fraction": 0.1,
            "segment": "short", "prompts_per_worker": 2, "async_level": 1, "replicas": 2, "quorum": 1,
            "validators": [SENDER.public_bytes.hex(), "ab" * 32], "precision": "float32", "task_root": ""}
    return {"architecture": "Qwen2ForCausalLM", "config": {"hidden_size": 64, "rope_theta": 1e4, "tie": True},
            "tokenizer": "byte", "run_spec": spec}


def sample_manifest():
    files = []
    for name, size in (("model-00000.safetensors", 300_000), ("model-00001.safetensors", 70_000)):
        hashes = tuple(blake3.blake3(f"{name}/{i}".encode()).digest() for i in range(-(-size // MIN_PIECE_SIZE)))
        files.append(FileEntry(name, size, MIN_PIECE_SIZE, hashes, blake3.blake3(b"".join(hashes)).digest()))
    tensors = (TensorEntry("layer0.w", files[0].name, 120, 1200, "F32", (20, 15), bytes(range(32))),
               TensorEntry("layer1.b", files[1].name, 88, 56, "I64", (7,), bytes(32)))
    return PolicyManifest(RUN, 3, 2, NOW, manifest_model(), GenerationSettings(4, 0.6, 64, 0), tensors, tuple(files))


def sample_patched_manifest():
    """The sample manifest as a patch over its parent: one more file, the patch, and the reference to it."""
    base = sample_manifest()
    hashes = (blake3.blake3(b"patch").digest(),)
    patch = FileEntry("model.patch", 9_000, MIN_PIECE_SIZE, hashes, blake3.blake3(b"".join(hashes)).digest())
    return replace(base, files=base.files + (patch,), patch=PatchRef(bytes(range(32)), 2, "model.patch"))


@_cached
def manifest_samples() -> list[bytes]:
    return [sample_manifest().encode(), sample_patched_manifest().encode()]


def signed_bytes(manifest_bytes: bytes) -> bytes:
    """`manifest_bytes` signed by the fuzzing key: what a stranger serves for a manifest id it names."""

    signature = SENDER.sign(SIG_CONTEXT + blake3.blake3(manifest_bytes).digest())
    return SignedManifest(manifest_bytes, SENDER.public_bytes, signature).to_bytes()


@_cached
def signed_manifest_samples() -> list[bytes]:
    return [signed_bytes(manifest_samples()[0])]


def decode_signed_manifest(data: bytes) -> VerifiedManifest:
    return open_signed_manifest(data)


def decode_self_signed_manifest(data: bytes) -> VerifiedManifest:
    """Arbitrary manifest bytes, signed by a stranger and opened as a peer without --trainer-key opens them."""

    return open_signed_manifest(signed_bytes(data))


def decode_manifest_bytes(data: bytes) -> PolicyManifest:
    return decode_manifest(data)


def decode_run_spec(data: bytes) -> object:
    """A manifest's model description (already a plain tree by the manifest decoder) read as the run's spec."""
    from swarm.policy.runspec import RunSpec

    try:
        model = msgpack.unpackb(data, raw=False, strict_map_key=False)
    except Exception:  # noqa: BLE001 - the manifest decoder refuses it before any reader sees it
        raise ManifestError("fuzzed model description is not msgpack") from None
    if not (isinstance(model, dict) and _is_plain_tree(model, MAX_MODEL_DEPTH)):
        raise ManifestError("fuzzed model description is not a plain tree")
    return RunSpec.from_model(model)


@_cached
def run_spec_samples() -> list[bytes]:
    return [_pack(manifest_model())]


# ---------------------------------------------------------------------------------------------- DHT records


def decode_dht_record(data: bytes) -> LatestManifest:
    from p2p.dht.service import LatestManifest, latest_manifest_key

    return LatestManifest.decode(data, latest_manifest_key(RUN, SENDER.public_bytes))


@_cached
def dht_record_samples() -> list[bytes]:
    from p2p.dht.service import LatestManifest

    return [LatestManifest.sign(RUN, b"\x05" * 32, v, SENDER).encode() for v in (0, 7, 2**40)]


# ---------------------------------------------------------------------------------------------- the registry


def _targets() -> tuple[FuzzTarget, ...]:
    from swarm.bench import fuzz_reach_targets as reach

    return (
        FuzzTarget("envelope", decode_envelope, envelope_samples, (EnvelopeError,)),
        FuzzTarget("heartbeat", decode_gossip_heartbeat, heartbeat_samples, (EnvelopeError,)),
        FuzzTarget("heartbeat_status", decode_heartbeat_status, heartbeat_samples, (EnvelopeError,)),
        FuzzTarget("manifest_announcement", decode_gossip_manifest, announcement_samples, (EnvelopeError,)),
        FuzzTarget("vote_gossip", decode_gossip_votes, vote_samples, (EnvelopeError,)),
        FuzzTarget("rollout_gossip", decode_gossip_rollouts, rollout_body_samples, (EnvelopeError,)),
        FuzzTarget("vote_batch", decode_votes, vote_samples, (EnvelopeError,)),
        FuzzTarget("rollout_body", decode_rollout_body, rollout_body_samples, (EnvelopeError, RolloutRefused)),
        FuzzTarget("rollout_group", decode_rollout_group, rollout_group_samples, (RolloutSchemaError,)),
        FuzzTarget("rollout_blob", decode_rollout_blob, rollout_group_samples, (RolloutRefused,)),
        FuzzTarget("run_spec", decode_run_spec, run_spec_samples, (ManifestError, UserError)),
        FuzzTarget("manifest", decode_manifest_bytes, manifest_samples, (ManifestError,)),
        FuzzTarget("signed_manifest", decode_signed_manifest, signed_manifest_samples, (ManifestError,)),
        FuzzTarget("self_signed_manifest", decode_self_signed_manifest, manifest_samples, (ManifestError,)),
        FuzzTarget("dht_record", decode_dht_record, dht_record_samples, (DHTError,)),
        FuzzTarget("piece_frames", stream.decode_piece_frames, stream.frame_samples, (FrameError,), frame_prefix=4),
        FuzzTarget("channel_request", stream.decode_channel_request, stream.channel_request_samples,
                   (ChannelError,), frame_prefix=2),
        FuzzTarget("channel_offer", stream.decode_channel_offer, stream.channel_offer_samples, (ChannelError,),
                   frame_prefix=2),
        FuzzTarget("preamble_head", stream.decode_preamble_head, stream.preamble_head_samples, (ChannelError,)),
        FuzzTarget("channel_records", stream.decode_channel_records, stream.channel_record_samples,
                   (ChannelError,)),
        FuzzTarget("punch_connect", reach.decode_punch_connect, reach.punch_connect_samples, reach.ERRORS),
        FuzzTarget("hop_request", reach.decode_hop_request, reach.hop_request_samples, reach.ERRORS),
        FuzzTarget("policy_patch", patch.decode_patch, patch.patch_samples, patch.ERRORS),
    )


TARGETS: tuple[FuzzTarget, ...] = _targets()
BY_NAME: dict[str, FuzzTarget] = {target.name: target for target in TARGETS}


def failure_of(target: FuzzTarget, data: bytes) -> dict | None:
    """None when `target` holds its property on `data`; else the finding: target, exception type, message, and
    the input as hex (what a reproducer needs)."""
    try:
        target.decode(data)
    except target.expected:
        return None
    except Exception as exc:  # noqa: BLE001 - the finding itself: any other exception breaks the property
        return {"target": target.name, "type": type(exc).__name__, "message": str(exc)[:300], "input_hex": data.hex()}
    return None
