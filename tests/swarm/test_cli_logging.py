"""`swarm -v` / `--log-level`: the project's loggers speak up when asked, third-party ones stay quiet, and without
the flags nothing changes (WARNING)."""

from __future__ import annotations

import logging
import signal
import subprocess
import sys
import time

import pytest

from p2p.identity import Identity
from swarm.cli.main import PROJECT_LOGGERS, build_parser, configure_logging, main


@pytest.fixture(autouse=True)
def _restore_levels():
    names = [*PROJECT_LOGGERS, "libp2p"]
    saved = {name: logging.getLogger(name).level for name in names}
    yield
    for name, level in saved.items():
        logging.getLogger(name).setLevel(level)


def _levels() -> dict[str, int]:
    return {name: logging.getLogger(name).getEffectiveLevel() for name in PROJECT_LOGGERS}


@pytest.mark.parametrize("flags, level", [
    (["-v"], logging.INFO), (["-vv"], logging.DEBUG), (["--log-level", "ERROR"], logging.ERROR),
    (["-vv", "--log-level", "warning"], logging.WARNING),
])
def test_flags_before_or_after_the_command_set_every_project_logger(tmp_path, flags, level):
    for argv in ([*flags, "keygen", str(tmp_path / f"a{len(flags)}.key")],
                 ["keygen", str(tmp_path / f"b{len(flags)}.key"), *flags]):
        logging.getLogger("swarm").setLevel(logging.NOTSET)
        assert main(argv) == 0
        assert set(_levels().values()) == {level}


def test_without_flags_no_level_changes(tmp_path):
    before = _levels()
    assert main(["keygen", str(tmp_path / "k.key")]) == 0
    assert _levels() == before
    args = build_parser(["train"]).parse_args(["train"])
    assert (args.verbose, args.log_level) == (None, None)


def test_a_third_party_logger_keeps_its_level():
    libp2p = logging.getLogger("libp2p")
    libp2p.setLevel(logging.CRITICAL)
    configure_logging(2, None)
    assert libp2p.level == logging.CRITICAL and logging.getLogger("p2p.host").getEffectiveLevel() == logging.DEBUG


def test_an_unknown_level_is_one_usage_line(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["--log-level", "loud", "keygen", "x"])
    assert exit_.value.code == 2 and "invalid choice: 'loud'" in capsys.readouterr().err


def _peer_stderr(tmp_path, *flags: str) -> str:
    """A real `swarm peer start` whose only bootstrap peer is down (py-libp2p refuses the dial at once, logged by
    p2p.host.p2p_host at INFO), stopped by Ctrl-C once it says so in its events; its stderr."""
    dead = f"/ip4/127.0.0.1/tcp/9/p2p/{Identity.generate().peer_id}"
    peer = subprocess.Popen([sys.executable, "-m", "swarm", *flags, "peer", "start", "--role", "seed", "--run", "t",
                             "--data-dir", str(tmp_path / f"d{len(flags)}"), "--bootstrap", dead, "--json-events"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and '"bootstrap_unreachable"' not in (peer.stdout.readline() or "x"):
            assert peer.poll() is None, peer.stderr.read()
        peer.send_signal(signal.SIGINT)
        assert peer.wait(30) == 130
    finally:
        if peer.poll() is None:
            peer.kill()
            peer.wait()
    return peer.stderr.read()


def test_a_real_peer_logs_its_info_lines_with_v_and_not_without(tmp_path):
    assert "info p2p.host.p2p_host: bootstrap peer unreachable" in _peer_stderr(tmp_path, "-v")
    assert "bootstrap peer unreachable" not in _peer_stderr(tmp_path)


def test_status_quiets_the_network_layers_unless_v_asks_for_them():
    from argparse import Namespace

    from swarm.cli.status import quiet_network_logs

    configure_logging(1, None)
    quiet_network_logs(Namespace(verbose=1, log_level=None))
    assert logging.getLogger("p2p.host").getEffectiveLevel() == logging.INFO
    quiet_network_logs(Namespace(verbose=None, log_level=None))
    assert logging.getLogger("p2p.host").getEffectiveLevel() == logging.ERROR
