"""Bootstrap peer lists: parse and validate multiaddrs from a flag, a config entry or bootstrap_peers.txt.

Why validate up front: a typo in a bootstrap line otherwise surfaces minutes later as a dial failure deep in
libp2p. Each bad line is named (source and line number) in one sentence. Precedence (docs/operations.md): the
command-line flag, else the config entry, else the file.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path

from multiaddr import Multiaddr

from p2p.errors import BootstrapError

DEFAULT_BOOTSTRAP_FILE = Path("bootstrap_peers.txt")


def validate_multiaddr(text: str, where: str) -> str:
    """Return `text` stripped if it is a dialable multiaddr ending in /p2p/<peer id>; else a BootstrapError."""
    addr = text.strip()
    try:
        parsed = Multiaddr(addr)
        peer = parsed.get_peer_id()
    except Exception as exc:  # noqa: BLE001 - the multiaddr library raises many types for bad input
        raise BootstrapError(f"{where}: {addr!r} is not a valid multiaddr ({exc})") from exc
    if not peer:
        raise BootstrapError(f"{where}: {addr!r} lacks the /p2p/<peer id> part needed to dial it securely")
    return addr


def peer_id_of(multiaddr: str) -> str:
    """The peer id a validated multiaddr ends with (its /p2p/<peer id> part)."""
    return multiaddr.rsplit("/p2p/", 1)[-1]


def parse_bootstrap_lines(lines: Iterable[str], source: str) -> tuple[str, ...]:
    """Multiaddrs from text lines; blank lines and '#' comments (whole-line or trailing) are skipped."""
    addrs: list[str] = []
    for number, raw in enumerate(lines, start=1):
        line = raw.split("#", 1)[0].strip()
        if line:
            addrs.append(validate_multiaddr(line, f"{source} line {number}"))
    return tuple(dict.fromkeys(addrs))


def load_bootstrap_file(path: Path) -> tuple[str, ...]:
    """Multiaddrs listed in a bootstrap file; a missing file is an empty list (a first peer needs none)."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return ()
    except (OSError, UnicodeDecodeError) as exc:
        raise BootstrapError(f"cannot read bootstrap file {path}: {exc}") from exc
    return parse_bootstrap_lines(text.splitlines(), str(path))


def resolve_bootstrap(
    flag: Sequence[str] | None = None,
    config: Sequence[str] | None = None,
    file: Path | None = DEFAULT_BOOTSTRAP_FILE,
) -> tuple[str, ...]:
    """The bootstrap list in force: the flag if given, else the config entry, else the file."""
    if flag:
        return parse_bootstrap_lines(flag, "--bootstrap")
    if config:
        return parse_bootstrap_lines(config, "config bootstrap")
    if file is None:
        return ()
    return load_bootstrap_file(file)
