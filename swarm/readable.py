"""Figures and model text as a person reads them in a progress line, never as Python's repr.

Why: a policy early in training writes arbitrary bytes, which decode to replacement characters and control codes
that garble a terminal, and dicts of counters (`{0: 4}`, `{'refused:stale': 2}`) read as code, not as words.
"""

from __future__ import annotations

import unicodedata

_SHOWN_AS = {"\ufffd": "?", "\n": "⏎", "\t": " "}


def readable_text(text: str, limit: int = 80) -> str:
    """`text` quoted on one line: undecodable bytes shown as '?', line breaks as '⏎', other control and invisible
    characters dropped; cut to `limit` characters with '…'."""
    shown = "".join(_SHOWN_AS.get(c, c) for c in str(text) if c in _SHOWN_AS or _printable(c))
    return f'"{shown[:limit]}…"' if len(shown) > limit else f'"{shown}"'


def _printable(character: str) -> bool:
    return unicodedata.category(character)[0] not in ("C", "Z") or character == " "


def readable_counts(counts: object, empty: str = "none") -> str:
    """A dict of counters as "name n, name n" in name order (`accepted 3, refused: stale 1`); `empty` when there
    are none; anything else as plain text."""
    if not isinstance(counts, dict):
        return str(counts)
    parts = [f"{str(name).replace(':', ': ')} {n}" for name, n in sorted(counts.items(), key=lambda kv: str(kv[0]))]
    return ", ".join(parts) or empty


def readable_lags(lags: object) -> str:
    """The policy lags of a step's groups (`{0: 4, 1: 2}`) as "4 at lag 0, 2 at lag 1"."""
    if not isinstance(lags, dict) or not lags:
        return "none"
    return ", ".join(f"{n} at lag {lag}" for lag, n in sorted(lags.items(), key=lambda kv: str(kv[0])))
