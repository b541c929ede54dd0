"""report.html of a `swarm sim` run: what happened, in pictures, in one file that opens anywhere.

Why drawn here as inline SVG: the report must open on a machine with no network (no script, no stylesheet or font
from a CDN) and stay readable in ten years, and the pictures are simple enough (a few lines, bars and spans) that a
plotting library would add a dependency for nothing. Each chart's data is also written beside its shapes (a
`data-values` attribute, a `<title>` per mark), so the numbers can be read back without measuring pixels. Every
string from the report is escaped: a task name or a peer's reason is text, never markup.
"""

from __future__ import annotations

import math
from html import escape

from swarm.readable import readable_counts

PEER_NAME_CHARS = 24
"""Longest peer name drawn beside its row (the simulation's are ten characters or so)."""
WIDTH, HEIGHT = 720, 240
LEFT, RIGHT, TOP, BOTTOM = 56, 16, 16, 36
PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22",
           "#17becf")
STYLE = """body{font-family:system-ui,sans-serif;margin:2em auto;max-width:760px;color:#222}
h1{font-size:1.4em}h2{font-size:1.1em;margin-top:2em}svg{background:#fafafa;border:1px solid #ddd}
.axis{stroke:#888;stroke-width:1}.grid{stroke:#e4e4e4;stroke-width:1}text{font-size:11px;fill:#444}
.legend{font-size:12px}table{border-collapse:collapse}td,th{padding:2px 8px;text-align:left}
.ban{color:#b00}.swatch{display:inline-block;width:10px;height:10px;margin:0 4px 0 12px}"""


def render_html(report: dict) -> str:
    """The whole page for a report that `swarm.sim.run.summarize` made (its `timeline` included)."""
    line = report.get("timeline") or {}
    sections = [_summary(report), _reward_section(line, report.get("heldout_accuracy")), _groups_section(line),
                _spread_section(line),
                _ban_section(line, report)]
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>swarm sim report</title>"
            f"<style>{STYLE}</style></head><body>\n<h1>swarm sim report</h1>\n" + "\n".join(sections) +
            "\n</body></html>\n")


def _summary(report: dict) -> str:
    rows = [("wall time", f"{report.get('wall_s')} s" + (" (TIMED OUT)" if report.get("timed_out") else "")),
            ("trainer steps", report.get("steps")), ("versions published", report.get("versions_published")),
            ("policy copies completed", report.get("policy_copies_completed")),
            ("rollout groups generated", report.get("groups_generated")),
            ("rejecting votes", f"{report.get('votes_rejecting')} "
                                f"({readable_counts(report.get('rejection_reasons'))})"),
            ("held-out accuracy", _accuracy_text(report.get("heldout_accuracy"))),
            ("final policy", report.get("final_policy"))]
    cells = "".join(f"<tr><th>{escape(k)}</th><td>{escape(str(v))}</td></tr>" for k, v in rows)
    return f'<section id="summary"><h2>Summary</h2><table>{cells}</table></section>'


_EVALUATIONS = (("before", "before training"), ("during", "during"), ("after", "after"),
                ("constant_answer", "always the most frequent training answer"))


def _accuracy_text(accuracy: object) -> str:
    """The held-out evaluations as words: "before training 0.100, after 0.400, ..." ("none" without any)."""
    if not isinstance(accuracy, dict) or not accuracy:
        return "none"
    named = dict(_EVALUATIONS)
    order = [key for key, _ in _EVALUATIONS if key in accuracy] + sorted(k for k in accuracy if k not in named)
    return ", ".join(f"{named.get(key, key)} {_share(accuracy[key])}" for key in order)


def _share(value: object) -> str:
    return f"{value:.3f}" if isinstance(value, (int, float)) else str(value)


# ------------------------------------------------------------------------------------------------------ charts
class Frame:
    """A chart's plotting area: data coordinates to SVG pixels (y grows downwards in SVG)."""

    def __init__(self, x_range: tuple[float, float], y_range: tuple[float, float], height: int = HEIGHT,
                 left: int = LEFT) -> None:
        self.x0, self.x1 = x_range[0], x_range[1] if x_range[1] > x_range[0] else x_range[0] + 1
        self.y0, self.y1 = y_range[0], y_range[1] if y_range[1] > y_range[0] else y_range[0] + 1
        self.height, self.left = height, left

    def x(self, value: float) -> float:
        return round(self.left + (value - self.x0) / (self.x1 - self.x0) * (WIDTH - self.left - RIGHT), 1)

    def y(self, value: float) -> float:
        return round(self.height - BOTTOM - (value - self.y0) / (self.y1 - self.y0) * (self.height - TOP - BOTTOM), 1)

    def axes(self, x_label: str, y_label: str, y_ticks: list[float], x_ticks: list[float]) -> str:
        bottom, parts, left = self.height - BOTTOM, [], self.left
        for tick in y_ticks:
            parts.append(f'<line class="grid" x1="{left}" x2="{WIDTH - RIGHT}" y1="{self.y(tick)}" '
                         f'y2="{self.y(tick)}"/><text x="{left - 6}" y="{self.y(tick) + 4}" '
                         f'text-anchor="end">{_number(tick)}</text>')
        for tick in x_ticks:
            parts.append(f'<text x="{self.x(tick)}" y="{bottom + 14}" text-anchor="middle">{_number(tick)}</text>')
        parts.append(f'<line class="axis" x1="{left}" x2="{WIDTH - RIGHT}" y1="{bottom}" y2="{bottom}"/>'
                     f'<line class="axis" x1="{left}" x2="{left}" y1="{TOP}" y2="{bottom}"/>'
                     f'<text x="{(left + WIDTH - RIGHT) / 2}" y="{self.height - 4}" text-anchor="middle">'
                     f'{escape(x_label)}</text><text x="12" y="{(TOP + bottom) / 2}" text-anchor="middle" '
                     f'transform="rotate(-90 12 {(TOP + bottom) / 2})">{escape(y_label)}</text>')
        return "".join(parts)


def _svg(body: str, label: str, height: int = HEIGHT) -> str:
    return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" '
            f'viewBox="0 0 {WIDTH} {height}" role="img" aria-label="{escape(label)}">{body}</svg>')


def _number(value: float) -> str:
    return f"{value:g}" if isinstance(value, (int, float)) else escape(str(value))


def _step_ticks(steps: list[int], most: int = 12) -> list[int]:
    """Every step when there are few, else about `most` of them evenly spread (labels must not overlap)."""
    steps = sorted(set(steps))
    if len(steps) <= most:
        return steps
    stride = -(-len(steps) // most)
    return steps[::stride]


def _ticks(low: float, high: float, count: int = 5) -> list[float]:
    """Round ticks inside [low, high], `count` to twice as many: multiples of 1, 2, 2.5 or 5 times a power of ten
    (0, 5, 10, 15 rather than 0, 6.175, 12.35)."""
    if high <= low:
        return [low]
    raw = (high - low) / max(1, count - 1)
    power = 10.0 ** math.floor(math.log10(raw))
    step = max(m * power for m in (1, 2, 2.5, 5) if m * power <= raw * (1 + 1e-9))  # count to twice as many
    first = math.ceil(low / step - 1e-9)
    ticks = [(first + i) * step for i in range(int((high - first * step) / step + 1e-9) + 1)]
    return [int(t) if float(t).is_integer() else round(t, 6) for t in ticks]


def _series(frame: Frame, points: list[tuple[float, float]], css_class: str, color: str, label: str) -> str:
    """A polyline through `points` with a dot and a tooltip per point; `data-values` holds the y values."""
    if not points:
        return ""
    d = " ".join(f"{'M' if i == 0 else 'L'}{frame.x(x)},{frame.y(y)}" for i, (x, y) in enumerate(points))
    values = ",".join(_number(y) for _, y in points)
    dots = "".join(f'<circle cx="{frame.x(x)}" cy="{frame.y(y)}" r="3" fill="{color}"><title>{escape(label)} '
                   f'at step {_number(x)}: {_number(y)}</title></circle>' for x, y in points)
    return (f'<path class="{css_class}" d="{d}" data-values="{values}" fill="none" stroke="{color}" '
            f'stroke-width="2"/>{dots}')


def _legend(entries: list[tuple[str, str]]) -> str:
    """A chart's key, below its picture rather than on it, where it would hide the points under it."""
    items = "".join(f'<span class="swatch" style="background:{color}"></span>{escape(label)}'
                    for label, color in entries)
    return '<p class="legend">' + items + "</p>"


# ---------------------------------------------------------------------------------------------------- sections
def _reward_section(line: dict, accuracy: object = None) -> str:
    """The trainer's reward per step and the held-out accuracy (before training, during, after), one axis: both
    are a share of the task solved, in [0, 1] for every built-in task. Two dashed lines give the held-out score to
    beat: the starting policy's, and always giving the most frequent training answer's, so a curve that only
    learned the commonest answer shows as one that never left its line."""
    steps = [s for s in line.get("steps", []) if isinstance(s.get("reward"), (int, float))]
    rewards = [(s["step"], s["reward"]) for s in steps]
    heldout = [(e["step"], e["accuracy"]) for e in line.get("heldout", [])
               if isinstance(e.get("step"), int) and isinstance(e.get("accuracy"), (int, float))]
    if not rewards and not heldout:
        return '<section id="reward"><h2>Reward and held-out accuracy</h2><p>No step was trained.</p></section>'
    marks = _reference_marks(accuracy)
    xs = [x for x, _ in rewards + heldout]
    ys = [y for _, y in rewards + heldout] + [y for _, _, y, _ in marks]
    frame = Frame((min(xs), max(xs)), (min(0.0, min(ys)), max(1.0, max(ys))))
    body = (frame.axes("trainer step", "reward / accuracy", _ticks(frame.y0, frame.y1),
                       _step_ticks([int(x) for x in xs]))
            + "".join(_level(frame, css, y, color, label) for css, label, y, color in marks)
            + _series(frame, rewards, "reward", PALETTE[0], "reward")
            + _series(frame, heldout, "heldout", PALETTE[2], "held-out accuracy"))
    legend = _legend([("reward on the trained groups", PALETTE[0]), ("held-out accuracy (greedy)", PALETTE[2])]
                     + [(f"{label}: {_share(y)} (dashed)", color) for _, label, y, color in marks])
    return ('<section id="reward"><h2>Reward and held-out accuracy</h2>'
            f'{_svg(body, "reward and held-out accuracy per trainer step")}{legend}</section>')


def _reference_marks(accuracy: object) -> list[tuple[str, str, float, str]]:
    """(css class, label, held-out accuracy, colour) of the starting policy and of the constant answer."""
    if not isinstance(accuracy, dict):
        return []
    wanted = (("start", "before", "held-out accuracy before training", PALETTE[1]),
              ("constant", "constant_answer", "always the most frequent training answer", PALETTE[3]))
    return [(css, label, float(accuracy[key]), color) for css, key, label, color in wanted
            if isinstance(accuracy.get(key), (int, float))]


def _level(frame: Frame, css_class: str, y: float, color: str, label: str) -> str:
    """A dashed horizontal line across the chart at `y`, with its value in a tooltip."""
    return (f'<line class="{css_class}" x1="{frame.x(frame.x0)}" x2="{frame.x(frame.x1)}" y1="{frame.y(y)}" '
            f'y2="{frame.y(y)}" stroke="{color}" stroke-width="1.5" stroke-dasharray="6 4" data-value="{_number(y)}">'
            f'<title>{escape(label)}: {_number(y)}</title></line>')


def _groups_section(line: dict) -> str:
    """Per step, the rollout groups the validators' quorum accepted and rejected since the step before."""
    steps = line.get("steps", [])
    if not steps:
        return '<section id="groups"><h2>Accepted and rejected groups</h2><p>No step was trained.</p></section>'
    top = max([1] + [max(s["accepted"], s["rejected"]) for s in steps])
    frame = Frame((-0.5, len(steps) - 0.5), (0, top))
    width = (frame.x(1) - frame.x(0)) * 0.38
    bars = []
    for i, s in enumerate(steps):
        for offset, key, color in ((-width, "accepted", PALETTE[2]), (0.0, "rejected", PALETTE[3])):
            y = frame.y(s[key])
            bars.append(f'<rect class="{key}" x="{round(frame.x(i) + offset, 1)}" y="{y}" width="{round(width, 1)}" '
                        f'height="{round(frame.y(0) - y, 1)}" fill="{color}" data-step="{_number(s["step"])}" '
                        f'data-value="{s[key]}"><title>step {_number(s["step"])}: {s[key]} {key}</title></rect>')
    body = (frame.axes("trainer step", "groups settled", _ticks(0, top, min(5, top + 1)),
                       _step_ticks(list(range(len(steps)))))
            + "".join(bars))
    legend = _legend([("accepted by the quorum", PALETTE[2]), ("rejected", PALETTE[3])])
    return ('<section id="groups"><h2>Accepted and rejected groups per step</h2>'
            f'{_svg(body, "groups accepted and rejected per trainer step")}{legend}</section>')


def _spread_section(line: dict) -> str:
    """One row per peer, one span per policy version it held (from its verified copy to its garbage collection),
    the bans marked as vertical lines: how fast each version reached every peer."""
    spread = line.get("version_spread", {})
    peers = sorted({p for held in spread.values() for p in held}, key=_peer_order)
    if not peers:
        return '<section id="spread"><h2>Policy versions over the peers</h2><p>No copy completed.</p></section>'
    end = max(float(line.get("ended_s") or 0.0), 1.0)
    row = 22
    height = TOP + BOTTOM + row * len(peers)
    left = max(LEFT, 12 + 7 * max(len(peer[:PEER_NAME_CHARS]) for peer in peers))  # room for the whole name
    frame = Frame((0.0, end), (0, len(peers)), height, left)
    parts = [frame.axes("seconds since the start", "", [], _ticks(0.0, end))]
    for i, peer in enumerate(peers):
        parts.append(f'<text x="{left - 6}" y="{TOP + row * i + 15}" text-anchor="end">'
                     f'{escape(peer[:PEER_NAME_CHARS])}</text>')
    for version, held in spread.items():
        color = PALETTE[int(version) % len(PALETTE)]
        for peer, (start, until) in held.items():
            x0, x1 = frame.x(start), frame.x(end if until is None else until)
            shown_until = "" if until is None else until
            parts.append(f'<rect class="held" x="{x0}" y="{TOP + row * peers.index(peer) + 3}" '
                         f'width="{round(max(1.0, x1 - x0), 1)}" height="{row - 6}" fill="{color}" '
                         f'fill-opacity="0.55" stroke="{color}" data-version="{escape(version)}" '
                         f'data-peer="{escape(peer)}" data-from="{start}" data-until="{shown_until}">'
                         f'<title>{escape(peer)} held v{escape(version)} from {start} s to '
                         f'{"the end" if until is None else f"{until} s"}</title></rect>')
    for ban in line.get("bans", []):
        x = frame.x(ban["at_s"])
        parts.append(f'<line class="ban" x1="{x}" x2="{x}" y1="{TOP}" y2="{height - BOTTOM}" stroke="#b00" '
                     f'stroke-dasharray="4 3" data-at="{ban["at_s"]}"><title>{escape(str(ban.get("peer") or ""))} '
                     f'banned at {ban["at_s"]} s</title></line>')
    legend = _legend([(f"v{version}", PALETTE[int(version) % len(PALETTE)])
                      for version in sorted(spread, key=int)[:len(PALETTE)]])
    return ('<section id="spread"><h2>Policy versions over the peers</h2><p>Each span: a peer holding a verified '
            'copy of one version (colour by version, repeating after ten), until it left the async window. Dashed: '
            f'a ban.</p>{_svg("".join(parts), "policy versions held by each peer over time", height)}{legend}'
            '</section>')


def _peer_order(peer: str) -> tuple[int, str]:
    roles = ("trainer", "validator", "inference", "cheater", "seed")
    return next((i for i, r in enumerate(roles) if peer.startswith(r)), len(roles)), peer


def _ban_section(line: dict, report: dict) -> str:
    bans = line.get("bans", [])
    if not bans:
        banned = report.get("banned_workers") or []
        text = "No worker was banned." if not banned else f"Banned at the end: {', '.join(map(str, banned))}."
        return f'<section id="bans"><h2>Bans</h2><p>{escape(text)}</p></section>'
    items = "".join(
        f'<li class="ban" data-at="{ban["at_s"]}">{escape(str(ban.get("peer") or "a worker"))} '
        f'({escape(str(ban.get("worker")))}) banned by {escape(str(ban.get("reported_by")))} at {ban["at_s"]} s '
        f'({escape(str(ban.get("by")))}): {escape(str(ban.get("reason")))}</li>' for ban in bans)
    return f'<section id="bans"><h2>Bans</h2><ul>{items}</ul></section>'
