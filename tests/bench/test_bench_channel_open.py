"""`swarm bench channel-open` at its smallest: both kinds of channel opened and priced, the ticket round using
tickets, and nonsense counts refused in one sentence."""

from __future__ import annotations

import json

from swarm.cli.main import main


def test_a_tiny_run_prices_both_kinds_of_channel_and_uses_tickets(capsys):
    assert main(["bench", "channel-open", "--channels", "8", "--rounds", "1", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert set(report["cpu_ms_per_channel"]) == {"handshake", "tickets"}
    assert all(len(values) == 1 and values[0] > 0 for values in report["cpu_ms_per_channel"].values())
    assert report["ticket_channels"] >= 8  # of the 16 ticket-round channels, three in four came with a ticket
    assert report["tickets_over_handshake"] > 0


def test_nonsense_counts_are_one_sentence(capsys):
    assert main(["bench", "channel-open", "--channels", "0"]) == 2
    assert "--channels" in capsys.readouterr().err
