"""`--metrics-port`: each peer's Prometheus endpoint, scraped over HTTP before and after a policy transfer (in-process
nodes and a real `swarm peer start` process), and held against scrapers that misbehave."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from types import SimpleNamespace

import pytest
import trio
import trio.testing
from prometheus_client.parser import text_string_to_metric_families

from p2p.identity import Identity, write_key_file
from swarm.cli.main import main
from swarm.event_types import Gate, Generated, TrainStep, Validated
from swarm.events import Emitted
from swarm.node.metrics import MAX_REQUEST_BYTES, MAX_SCRAPES, PieceTotals, RoleCounters, answer, handle_scrape
from tests.test_swarm_nodes import Peer, make_checkpoint, signed_checkpoint


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def parse(text: str) -> dict[tuple, float]:
    """{(sample name, sorted labels): value} of a scrape."""
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def scrape_blocking(port: int) -> dict[tuple, float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=20) as response:
        assert response.headers["Content-Type"].startswith("text/plain; version=")
        return parse(response.read().decode())


async def scrape(port: int) -> dict[tuple, float]:
    return await trio.to_thread.run_sync(scrape_blocking, port)


def value(metrics: dict, name: str, **labels) -> float:
    return metrics[(name, tuple(sorted(labels.items())))]


async def test_counters_of_both_peers_move_with_a_transfer(tmp_path):
    trainer = Identity.generate()
    _, manifest, signed = signed_checkpoint(tmp_path, trainer)
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            seed = Peer(tmp_path, "seed", trainer, identity=trainer, metrics_port=free_port())
            nursery.start_soon(seed.run)
            await seed.ready.wait()
            before = await scrape(seed.config.peer.metrics_port)
            assert value(before, "rlswarm_pieces_total", direction="served") == 0
            assert value(before, "rlswarm_policy_version") == -1
            seed.node.mirror.adopt(signed, local_dir=tmp_path / "ckpt")
            fetcher = Peer(tmp_path, "fetcher", trainer, bootstrap=[seed.node.host.multiaddrs[0]],
                           metrics_port=free_port())
            nursery.start_soon(fetcher.run)
            await fetcher.ready.wait()
            await fetcher.wait_complete(manifest.id)
            while fetcher.node.gossip.stats.delivered == 0:  # a heartbeat of the seed has come (every 0.5 s)
                await trio.sleep(0.05)
            got, served = await scrape(fetcher.config.peer.metrics_port), await scrape(seed.config.peer.metrics_port)
            seed.stop()
            fetcher.stop()
    pieces = manifest.num_pieces
    assert value(got, "rlswarm_pieces_total", direction="received") >= pieces
    assert value(got, "rlswarm_pieces_verified_total") == value(got, "rlswarm_pieces_total", direction="received")
    assert value(got, "rlswarm_pieces_failed_total") == 0
    assert value(got, "rlswarm_piece_bytes_total", direction="received") >= manifest.total_size
    assert value(served, "rlswarm_pieces_total", direction="served") >= pieces
    assert value(got, "rlswarm_policy_version") == value(served, "rlswarm_policy_version") == 1
    assert value(got, "rlswarm_gossip_delivered_total") >= 1
    assert value(got, "rlswarm_gossip_bytes_total", direction="delivered") > 0
    assert value(served, "rlswarm_gossip_bytes_total", direction="published") > 0
    assert value(got, "rlswarm_connections", direction="total") >= 1  # py-libp2p's own connection counts
    info = [k for k in got if k[0] == "rlswarm_peer_info"]
    assert len(info) == 1 and ("peer_id", fetcher.node.peer_id) in info[0][1] and ("run", "t") in info[0][1]


def test_a_real_peer_process_serves_its_metrics_after_fetching_a_policy(tmp_path):
    """`swarm publish` seeds a policy; `swarm peer start --metrics-port` fetches it; its /metrics says so."""
    make_checkpoint(tmp_path / "ckpt", floats=200_000)
    key = Identity.generate()
    write_key_file(tmp_path / "trainer.key", key)
    swarm, port = [sys.executable, "-m", "swarm"], free_port()
    pub = subprocess.Popen([*swarm, "publish", str(tmp_path / "ckpt"), "--run", "p", "--key",
                            str(tmp_path / "trainer.key"), "--data-dir", str(tmp_path / "pub"), "--piece-kb", "256"],
                           stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    peer = None
    try:
        addr = [pub.stdout.readline() for _ in range(2)][1].strip()
        peer = subprocess.Popen([*swarm, "peer", "start", "--role", "seed", "--run", "p", "--bootstrap", addr,
                                 "--data-dir", str(tmp_path / "peer"), "--json-events", "--metrics-port", str(port),
                                 "--trainer-key", key.public_bytes.hex()],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        events = _events_until(peer, "complete", time.monotonic() + 60)
        metrics = scrape_blocking(port)
        peer.send_signal(signal.SIGINT)
        assert peer.wait(30) == 130
    finally:
        for process in (pub, peer):
            if process is not None and process.poll() is None:
                process.terminate()
                process.wait(10)
    (listening,) = [e for e in events if e["event"] == "metrics_listening"]
    assert listening["url"] == f"http://127.0.0.1:{port}/metrics"
    (adopted,) = [e for e in events if e["event"] == "adopted"]
    assert value(metrics, "rlswarm_pieces_verified_total") >= adopted["pieces"] > 0
    assert value(metrics, "rlswarm_policy_version") == 1
    assert value(metrics, "rlswarm_pieces_failed_total") == 0


def _events_until(process, kind: str, deadline: float) -> list[dict]:
    events = []
    while time.monotonic() < deadline:
        line = process.stdout.readline()
        if not line:
            break
        if line.startswith("{"):
            events.append(json.loads(line))
            if events[-1]["event"] == kind:
                return events
    raise AssertionError(f"no {kind} event; saw {[e['event'] for e in events]}; stderr: {process.stderr.read()}")


def test_a_taken_port_is_one_line_and_no_peer(tmp_path, capsys):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        status = main(["peer", "start", "--role", "seed", "--run", "t", "--data-dir", str(tmp_path / "d"),
                       "--metrics-port", str(port)])
    err = capsys.readouterr().err
    assert status == 2 and f"cannot serve metrics on 127.0.0.1:{port}" in err
    assert "Traceback" not in err and not (tmp_path / "d").exists()


def test_bad_ports_are_refused_before_the_peer_writes_anything(tmp_path, capsys):
    assert main(["peer", "start", "--data-dir", str(tmp_path / "d"), "--metrics-port", "70000"]) == 2
    assert "metrics_port 70000 is outside 0..65535" in capsys.readouterr().err
    assert not (tmp_path / "d").exists()


def test_piece_counters_never_fall_when_a_version_is_dropped():
    def policy(down, up, corrupt=0):
        stats = {"peer": SimpleNamespace(pieces_down=down, pieces_up=up, pieces_corrupt=corrupt, bytes_down=down * 10,
                                         bytes_up=up * 10)}
        return SimpleNamespace(service=SimpleNamespace(stats=stats))

    totals = PieceTotals()
    v1, v2 = policy(5, 2, corrupt=1), policy(3, 0)
    totals.observe({b"1": v1, b"2": v2})
    v1.service.stats["peer"].pieces_up = 4  # it served more before it was dropped, unseen by any scrape
    totals.observe({b"2": v2})
    assert totals.totals()["pieces_down"] == 8 and totals.totals()["pieces_up"] == 4
    assert totals.totals()["pieces_corrupt"] == 1 and b"1" not in totals.live


def test_role_counters_sum_events_and_ignore_junk():
    roles = RoleCounters()
    for event in [Generated(version=1, groups=2, completions=8, tokens=40),
                  Generated(version=1, groups=True, completions=-3, tokens="9"),  # junk a typo could send
                  Validated(checked=6), Validated(checked=4),
                  Gate(waiting=0, ready=0, counts={"accepted": 3, "vote:accept": 5}),
                  Gate(waiting=0, ready=0, counts=7),
                  TrainStep(step=3, reward=None, stage="s", gate={"accepted": 3, "vote:accept": 5})]:
        roles.on_event(Emitted(event, 0.0))
    assert (roles.groups, roles.rollouts, roles.tokens, roles.votes_cast) == (2, 8, 40, 6)
    assert roles.gate == {"accepted": 3, "vote:accept": 5} and roles.trainer_step == 3
    # a step carries the gate's counts it trained from: a run whose steps come within the gate's one-second tick
    # served no gate counts at all (its "gate" event had not come yet)
    roles.on_event(Emitted(TrainStep(step=4, reward=None, stage="s", gate={"accepted": 4, "vote:accept": 7}), 0.0))
    roles.on_event(Emitted(TrainStep(step=5, reward=None, stage="s", gate="junk"), 0.0))
    assert roles.gate == {"accepted": 4, "vote:accept": 7} and roles.trainer_step == 5


@pytest.mark.parametrize("head, status", [
    (b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n", "200 OK"),
    (b"GET /?name[]=x HTTP/1.0\r\n\r\n", "200 OK"),
    (b"HEAD /metrics HTTP/1.1\r\n\r\n", "200 OK"),
    (b"POST /metrics HTTP/1.1\r\n\r\n", "405 Method Not Allowed"),
    (b"GET /../etc/passwd HTTP/1.1\r\n\r\n", "404 Not Found"),
    (b"GET /metrics\r\n\r\n", "400 Bad Request"),
    (b"\xff\xfe garbage \x00\r\n\r\n", "400 Bad Request"),
])
def test_answers(head, status):
    got, body, _ = answer(head, lambda: b"rlswarm_x 1\n")
    assert got == status
    assert (body == b"rlswarm_x 1\n") == (status == "200 OK" and not head.startswith(b"HEAD"))


async def _exchange(request: bytes, limiter=None, close_after_send=True) -> bytes:
    client, server = trio.testing.memory_stream_pair()
    limiter = limiter or trio.CapacityLimiter(MAX_SCRAPES)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(handle_scrape, lambda: b"rlswarm_x 1\n", limiter, server)
        if request:
            await client.send_all(request)
        if close_after_send:
            await client.send_eof()
        received = b""
        while chunk := await client.receive_some(65536):
            received += chunk
    return received


async def test_a_scraper_that_never_finishes_its_head_is_cut_off_in_time(autojump_clock):
    start = trio.current_time()
    assert await _exchange(b"GET /metrics HTTP/1.1\r\n", close_after_send=False) == b""
    assert trio.current_time() - start == pytest.approx(5.0)


async def test_an_oversized_head_gets_no_answer(autojump_clock):
    assert await _exchange(b"GET /metrics HTTP/1.1\r\n" + b"X: y\r\n" * (MAX_REQUEST_BYTES // 6 + 10)) == b""


async def test_a_full_house_closes_new_connections_at_once(autojump_clock):
    limiter = trio.CapacityLimiter(1)
    async with limiter:  # every slot is taken by slow scrapers
        assert await _exchange(b"GET /metrics HTTP/1.1\r\n\r\n", limiter) == b""
    reply = await _exchange(b"GET /metrics HTTP/1.1\r\n\r\n", limiter)
    assert reply.startswith(b"HTTP/1.1 200 OK\r\n") and reply.endswith(b"\r\n\r\nrlswarm_x 1\n")
    assert b"Content-Length: 12\r\n" in reply and limiter.borrowed_tokens == 0

