"""What `swarm status --watch` draws: the status view's report (swarm.cli.status_view) as one rich renderable.

Why a pure function of the plain report: the live view, the JSON lines and the snapshot all show the same
numbers, and the drawing is tested by rendering to a string, with no terminal and no network. Every string that
came from a peer (roles, progress values, ids) enters the drawing as `rich.text.Text`, never as markup, so a peer
calling itself "[blink]trainer" draws those characters and not an effect.
"""

from __future__ import annotations

from rich.console import Console, ConsoleOptions, Group, RenderResult
from rich.table import Table
from rich.text import Text

PEER_ID_SHOWN = 16
"""Characters of a peer id in the wide table: enough to tell the peers of one run apart."""
WIDE_COLUMNS = 140
"""Below this many columns the table is the narrow one: short cells, each peer's progress on a line below it."""
NARROW_PEER_ID = 8
"""Characters of a peer id in the narrow table: the name peers give themselves on their log lines
(swarm.log_lines.short_peer_name)."""
NARROW_HEADERS = ("peer", "roles", "holds", "heard", "groups", "votes +/-", "judged +/-")
"""The narrow table's columns: `groups` is the groups heard from the peer during this watch (its own count since
it started is `groups_sent` in its progress), `votes +/-` its accepting / rejecting votes, `judged +/-` the votes
on its own rollouts taken together, accepted / rejected."""


def live_renderable(report: dict, refreshed_s: float | None = None) -> Group:
    """The report as a heading, a table of peers and a few summary lines; `refreshed_s`: seconds watched."""
    return Group(_heading(report, refreshed_s), PeerTable(report), *_summary(report))


class PeerTable:
    """The peers as the wide table, or, on a terminal narrower than WIDE_COLUMNS, the narrow one: chosen when
    drawn, so a resized terminal gets the layout that fits."""

    def __init__(self, report: dict) -> None:
        self.report = report

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        if options.max_width >= WIDE_COLUMNS:
            yield _peer_table(self.report)
            return
        yield _narrow_table(self.report)
        for row in self.report["peers"]:
            if row.get("progress"):
                yield Text(f"{row['peer'][-NARROW_PEER_ID:]}: " + _progress_text(row))


def _narrow_table(report: dict) -> Table:
    table = Table(expand=False, pad_edge=False, show_edge=False)
    for header in NARROW_HEADERS:
        table.add_column(header, min_width=len(header), overflow="fold")
    for row in report["peers"]:
        table.add_row(*_narrow_cells(row), style="red" if row.get("banned") else None)
    return table


def _narrow_cells(row: dict) -> list[Text]:
    held = ",".join(f"v{v}" for v in row["holds"]) or "-"
    if row["fetching"]:
        held += " +" + ",".join(f"v{v}" for v in row["fetching"])
    heard = "-" if row["heard_s_ago"] is None else f"{row['heard_s_ago']:g} s"
    groups = str(row.get("groups", ""))
    votes = "" if "votes" not in row else f"{row['votes']['accept']}/{row['votes']['reject']}"
    judged = row.get("judged")
    judged = "" if judged is None else f"{judged['accepted']}/{judged['rejected']}"
    if row.get("banned"):
        judged += " BANNED"
    cells = [row["peer"][-NARROW_PEER_ID:], ", ".join(row["roles"]) or "-", held, heard, groups, votes, judged]
    return [Text(cell) for cell in cells]


def _progress_text(row: dict) -> str:
    return ", ".join(f"{k} {v}" for k, v in row.get("progress", {}).items())


def _heading(report: dict, refreshed_s: float | None) -> Text:
    newest = report["newest_version"]
    text = Text(f"{len(report['peers'])} peers heard", style="bold")
    text.append(f" in {report['window_s']:g} s" if refreshed_s is None else f", watching for {refreshed_s:.0f} s")
    text.append(f"; newest policy {'none' if newest is None else f'v{newest}'}")
    manifest = report.get("manifest")
    if manifest:
        text.append("\n")
        text.append(_manifest_line(manifest))
    return text


def _manifest_line(manifest: dict) -> Text:
    if "mib" not in manifest:
        return Text(f"v{manifest['version']}: manifest {manifest['signature']}", style="red")
    return Text(f"v{manifest['version']}: {manifest['mib']} MiB, stage {manifest['stage']}, task {manifest['task']}, "
                f"quorum {manifest['quorum']} of {manifest['replicas']}, {manifest['signature']}")


def _peer_table(report: dict) -> Table:
    table = Table(expand=False, pad_edge=False, show_edge=False)
    for column in ("peer", "roles", "holds", "heard", "progress", "groups heard", "votes", "its rollouts"):
        wraps = column not in ("peer", "holds", "heard")
        table.add_column(column, no_wrap=not wraps, overflow="fold" if wraps else "ellipsis", min_width=len(column))
    for row in report["peers"]:
        table.add_row(*_peer_cells(row), style="red" if row.get("banned") else None)
    return table


def _peer_cells(row: dict) -> list[Text]:
    held = ",".join(f"v{v}" for v in row["holds"]) or "-"
    if row["fetching"]:
        held += " (fetching " + ",".join(f"v{v}" for v in row["fetching"]) + ")"
    heard = "-" if row["heard_s_ago"] is None else f"{row['heard_s_ago']:g} s ago"
    progress = _progress_text(row)
    groups = str(row.get("groups", ""))
    if row.get("claimed_mean_reward") is not None:
        groups += f" (claims {row['claimed_mean_reward']})"
    votes = "" if "votes" not in row else f"{row['votes']['accept']} accept / {row['votes']['reject']} reject"
    judged = row.get("judged")
    judged = "" if judged is None else f"{judged['accepted']} accepted / {judged['rejected']} rejected"
    if row.get("banned"):
        judged += " BANNED"
    cells = [row["peer"][-PEER_ID_SHOWN:], "+".join(row["roles"]) or "(no heartbeat)", held, heard, progress,
             groups, votes, judged]
    return [Text(cell) for cell in cells]


def _summary(report: dict) -> list[Text]:
    lines = []
    rates = report.get("throughput")
    if rates:
        lines.append(Text(f"throughput over the last {rates['over_s']:g} s: {rates['groups_per_min']:g} groups/min, "
                          f"{rates['votes_per_min']:g} votes/min"))
    if report["rollouts_voted"]:
        checks = report["rejecting_votes_by_check"]
        lines.append(Text(f"votes on {report['rollouts_voted']} rollouts, {report['rollouts_with_a_rejecting_vote']} "
                          f"with a rejecting vote" + (f" (failed checks: {checks})" if checks else "")))
    if report.get("banned_workers"):
        lines.append(Text("banned by the votes heard: " + ", ".join(report["banned_workers"]), style="red"))
    if report["refused_messages"]:
        lines.append(Text(f"{report['refused_messages']} messages refused (malformed, or signed by someone else)"))
    return lines
