"""Fixtures shared by the p2p tests.

`pair`: (server, server_host, client_host): a data-channel server on its host and a client host connected to it,
on loopback (tests.p2p.channel_helpers.channel_pair).
"""

from __future__ import annotations

import pytest

from tests.p2p.channel_helpers import channel_pair


@pytest.fixture
async def pair():
    async with channel_pair() as hosts:
        yield hosts
