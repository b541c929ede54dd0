"""Pubsub's signed peer record is built at most every SIGNED_RECORD_TTL_S (p2p.libp2p_compat.cache_signed_records),
and it is the record py-libp2p itself would send."""

from __future__ import annotations

from libp2p.peer import peerstore
from libp2p.pubsub import gossipsub, pubsub

from p2p import libp2p_compat
from p2p.host.p2p_host import open_host


async def test_the_record_is_reused_within_its_ttl_and_rebuilt_after(monkeypatch):
    async with open_host() as host:
        libp2p = host.libp2p
        asked = []
        real_get_addrs = libp2p.get_addrs
        monkeypatch.setattr(libp2p, "get_addrs", lambda: asked.append(1) or real_get_addrs())
        assert pubsub.env_to_send_in_RPC is gossipsub.env_to_send_in_RPC  # both modules use the cached one
        first, _ = pubsub.env_to_send_in_RPC(libp2p)
        assert first == peerstore.env_to_send_in_RPC(libp2p)[0]  # py-libp2p's own, unpatched
        asked.clear()
        for _ in range(50):
            assert gossipsub.env_to_send_in_RPC(libp2p)[0] == first
        assert asked == []  # fifty messages, no address listing
        monkeypatch.setattr(libp2p_compat, "SIGNED_RECORD_TTL_S", 0.0)
        assert pubsub.env_to_send_in_RPC(libp2p)[0] == first and asked  # rebuilt: the same addresses, so equal
