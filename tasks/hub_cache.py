"""Finding a Hugging Face hub repository (a model or a dataset) in the local Hugging Face cache, never the network.

Why read the cache's layout here instead of calling huggingface_hub: peers run offline, and a lookup must be
a few file reads that can neither hang on a download nor cost the second it takes to import huggingface_hub's
HTTP stack (seed peers and `swarm tasks` stay light). The layout is huggingface_hub's documented one:
HF_HUB_CACHE/{models,datasets}--ORG--NAME/refs/REVISION holds a commit hash, and snapshots/HASH/ holds the files
(links into blobs/). tests/inference/test_hub_models.py checks that huggingface_hub's own offline
snapshot_download finds the same directory.
"""

from __future__ import annotations

import hashlib
import os
import re
from dataclasses import dataclass
from pathlib import Path

# huggingface_hub's rule for a repo id: an optional namespace and a name, each 1-96 of ASCII letters, digits, '-',
# '_' and '.', neither starting nor ending with '-' or '.', and no '--' or '..' inside.
_PART = r"[A-Za-z0-9_](?:[A-Za-z0-9_.\-]{0,94}[A-Za-z0-9_])?"
_REPO_ID = re.compile(rf"(?:{_PART}/)?{_PART}")
_REVISION = re.compile(r"[A-Za-z0-9_.\-/]{1,128}")
_COMMIT = re.compile(r"[0-9a-f]{40}")  # a snapshot directory is named by its full commit hash


class NotCached(Exception):
    """The repository (or the revision asked for) has no snapshot in the local cache."""


@dataclass(frozen=True)
class HubReference:
    """A hub repository named on the command line: `ORG/NAME` or `ORG/NAME@REVISION`."""

    repo_id: str
    revision: str = "main"

    @property
    def name(self) -> str:
        """The repository's name without its namespace ("Qwen2.5-0.5B-Instruct")."""
        return self.repo_id.rsplit("/", 1)[-1]

    def __str__(self) -> str:
        return self.repo_id if self.revision == "main" else f"{self.repo_id}@{self.revision}"


def parse_reference(text: str) -> HubReference | None:
    """The hub repository `text` names, or None when it cannot be a hub id (a path, a typo with spaces...)."""
    repo_id, _, revision = text.partition("@")
    if not _REPO_ID.fullmatch(repo_id) or "--" in repo_id or ".." in repo_id:
        return None
    if revision and (not _REVISION.fullmatch(revision) or ".." in revision):
        return None
    return HubReference(repo_id, revision or "main")


def hub_cache_dir() -> Path:
    """The cache huggingface_hub would use now: HF_HUB_CACHE, else HF_HOME/hub, else ~/.cache/huggingface/hub
    (read at call time, so a test or a wrapper script can point it elsewhere)."""
    for variable in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"):
        if os.environ.get(variable):
            return Path(os.path.expanduser(os.environ[variable]))
    if os.environ.get("HF_HOME"):
        return Path(os.path.expanduser(os.environ["HF_HOME"])) / "hub"
    cache_home = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(cache_home) / "huggingface" / "hub"


def repo_folder(reference: HubReference, repo_type: str, cache: Path | None = None) -> Path:
    """Where the cache keeps every revision of the repository (repo_type "model" or "dataset")."""
    return (cache or hub_cache_dir()) / f"{repo_type}s--{reference.repo_id.replace('/', '--')}"


def cached_snapshot(reference: HubReference, repo_type: str, cache: Path | None = None) -> Path:
    """The snapshot directory of `reference`'s revision; raises NotCached when the cache has none."""
    folder = repo_folder(reference, repo_type, cache)
    commit = reference.revision
    ref_file = folder / "refs" / reference.revision
    if ref_file.is_file():
        try:
            commit = ref_file.read_text(encoding="ascii").strip()
        except (OSError, UnicodeDecodeError):
            raise NotCached(str(reference)) from None
    snapshot = folder / "snapshots" / commit
    if not _COMMIT.fullmatch(commit) or not snapshot.is_dir():
        raise NotCached(str(reference))
    return snapshot


def snapshot_repo_id(directory: Path, repo_type: str = "model") -> str | None:
    """The repo id whose cached snapshot `directory` is (ids hold no '--', so the folder name reverses), else None."""
    directory = Path(directory)
    folder, prefix = directory.parent.parent.name, f"{repo_type}s--"
    if directory.parent.name != "snapshots" or not folder.startswith(prefix):
        return None
    return folder[len(prefix):].replace("--", "/")


def fetch_hint(reference: HubReference, repo_type: str) -> str:
    """The command that puts the repository into a cache, to run on a machine with network."""
    kind = " --repo-type dataset" if repo_type == "dataset" else ""
    revision = f" --revision {reference.revision}" if reference.revision != "main" else ""
    return f"hf download {reference.repo_id}{kind}{revision}"


def write_snapshot(reference: HubReference, repo_type: str, files: dict[str, bytes], cache: Path,
                   commit: str = "0" * 40) -> Path:
    """Lay `files` (relative name -> bytes) out as huggingface_hub does after a download: blobs named by content,
    snapshot entries linking to them, and refs/REVISION naming the commit. For tests, and for putting a model into
    a cache by hand on a machine that cannot download it."""
    folder = repo_folder(reference, repo_type, cache)
    snapshot = folder / "snapshots" / commit
    for name, data in files.items():
        blob = folder / "blobs" / hashlib.sha256(data).hexdigest()
        blob.parent.mkdir(parents=True, exist_ok=True)
        blob.write_bytes(data)
        entry = snapshot / name
        entry.parent.mkdir(parents=True, exist_ok=True)
        entry.unlink(missing_ok=True)
        entry.symlink_to(os.path.relpath(blob, entry.parent))
    (folder / "refs").mkdir(parents=True, exist_ok=True)
    (folder / "refs" / reference.revision).write_text(commit)
    return snapshot
