"""Every printed line starts with the UTC time and the process's name; each record is printed once."""

import json
import logging
import re

import pytest

from swarm.cli.main import configure_logging
from swarm.event_types import BootstrapRetry
from swarm.events import EventSink
from swarm.log_lines import install_log_handler, set_line_name, short_peer_name

STAMP = r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ"


@pytest.fixture(autouse=True)
def _named():
    set_line_name("peerName")
    yield
    set_line_name("")
    install_log_handler()


def test_a_log_record_is_printed_once_with_time_name_level_and_logger_however_often_logging_is_configured(capsys):
    configure_logging(None, None)
    configure_logging(1, None)
    EventSink().configure_logging()
    logging.getLogger("swarm.somewhere").warning("disk %s", "full")
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1
    assert re.fullmatch(STAMP + r" peerName warning swarm\.somewhere: disk full", lines[0])


def test_json_log_format_prints_one_object_per_record(capsys):
    configure_logging(None, None, "json")
    logging.getLogger("trainer.loop").warning("skipped %s", "x")
    record = json.loads(capsys.readouterr().err)
    assert record["peer"] == "peerName" and record["level"] == "warning" and record["logger"] == "trainer.loop"
    assert record["message"] == "skipped x" and re.fullmatch(STAMP, record["t"])


def test_event_lines_carry_the_time_and_the_peer_name(capsys):
    EventSink().emit(BootstrapRetry(attempt=1, delay_s=2.0, message="no bootstrap peer reachable"))
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 1 and re.fullmatch(STAMP + " peerName warning: no bootstrap peer reachable", out[0])


def test_a_peer_is_named_by_the_end_of_its_id():
    assert short_peer_name("12D3KooWBTkshwmJPo5NcAZ2Af5Yr9asF4SNTP1fKbjWdFwxj7v1") == "dFwxj7v1"
