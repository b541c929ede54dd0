"""One peer of tests/p2p/test_reach_netns.py, in a namespace:
`python tests/p2p/netns_peer.py ROLE IP WORK NAME N PUNCH`.

ROLE "relay": a public host; writes its multiaddr to WORK/relay.addr and serves until terminated.
ROLE "private": a host bootstrapped from the relay; writes its announced multiaddr to WORK/NAME.addr, waits for the
N private peers' addresses, dials each peer named after it (so each pair is dialed once, through the relay), sends
every connected private peer 1 MiB and checks the BLAKE3 digest it answers, waits up to PUNCH seconds until every
connection to a private peer is hole-punched (0 where nothing can be punched), and writes WORK/NAME.json: its
reachability, how it is connected to each peer, and how many blobs were verified.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import blake3
import trio

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from p2p.host.p2p_host import HostConfig, open_host, read_exactly  # noqa: E402
from p2p.reach.probe import ReachConfig  # noqa: E402

BLOB = "/test/blob/1"
BLOB_BYTES = 1 << 20
REACH = ReachConfig(dial_back_timeout_s=1.0)
"""Every dial-back here ends in silence (firewalls and NATs drop it): a second tells that as well as three. The
asker still waits two seconds longer than the probe for the answer, as with the default."""


def _write(path: Path, text: str) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


async def _answer_blob(stream) -> None:
    data = await read_exactly(stream, BLOB_BYTES, "blob")
    await stream.write(blake3.blake3(data).digest())
    await stream.close()


async def _send_blob(host, peer: str) -> bool:
    data = os.urandom(BLOB_BYTES)
    with trio.fail_after(20):
        stream = await host.new_stream(peer, BLOB)
        await stream.write(data)
        return await read_exactly(stream, 32, "digest") == blake3.blake3(data).digest()


async def _wait_for(paths: list[Path], timeout: float) -> list[str]:
    with trio.fail_after(timeout):
        while not all(p.exists() for p in paths):
            await trio.sleep(0.1)
    return [p.read_text() for p in paths]


async def _wait_for_punches(host, peers: set[str], timeout: float) -> dict[str, str]:
    """How each peer is connected, once every one is hole-punched or `timeout` has passed: DCUtR drives every 2 s,
    peer after peer, and a punch takes a round trip over the relay plus the simultaneous open."""
    with trio.move_on_after(timeout):
        while any(host.reach.kinds(host.libp2p).get(p) != "hole-punched" for p in peers):
            await trio.sleep(0.2)
    return host.reach.kinds(host.libp2p)


async def private(ip: str, work: Path, name: str, count: int, punch_s: float) -> None:
    (relay_addr,) = await _wait_for([work / "relay.addr"], 20)
    config = HostConfig(listen=(f"/ip4/{ip}/tcp/4001",), bootstrap=(relay_addr,), reach=REACH)
    async with open_host(config) as host:
        host.set_guarded_handler(BLOB, _answer_blob)
        _write(work / f"{name}.addr", host.multiaddrs[0])
        names = [f"p{i}" for i in range(1, count + 1)]
        addrs = dict(zip(names, await _wait_for([work / f"{n}.addr" for n in names], 30), strict=True))
        peers = {n: a.rsplit("/p2p/", 1)[-1] for n, a in addrs.items() if n != name}
        for other in names[names.index(name) + 1:]:
            await host.connect(addrs[other])
        with trio.move_on_after(10):
            while not set(peers.values()) <= {str(p) for p in host.libp2p.get_connected_peers()}:
                await trio.sleep(0.1)
        verified = sum([await _send_blob(host, p) for p in peers.values()])
        kinds = await _wait_for_punches(host, set(peers.values()), punch_s)
        result = {"status": host.reach.status.value, "addr": host.multiaddrs[0], "verified": verified,
                  "kinds": {n: kinds.get(p, "none") for n, p in peers.items()}}
        _write(work / f"{name}.json", json.dumps(result))
        _write(work / f"{name}.done", "")
        await _wait_for([work / f"{n}.done" for n in names], 30)  # the others may still punch through us


async def relay(ip: str, work: Path) -> None:
    async with open_host(HostConfig(listen=(f"/ip4/{ip}/tcp/4001",), reach=REACH)) as host:
        _write(work / "relay.addr", host.multiaddrs[0])
        await trio.sleep_forever()


if __name__ == "__main__":
    role, ip, work_dir, who, total, punch_s = sys.argv[1:7]
    if role == "relay":
        trio.run(relay, ip, Path(work_dir))
    else:
        trio.run(private, ip, Path(work_dir), who, int(total), float(punch_s))
