"""The documentation's shape: a short README, the five documents of docs/, links and citations that resolve.

Why a test: the README is what a newcomer reads in five minutes and docs/ holds the rest, so the README's length
is a contract; the design and reference facts live in docs/ (the repository holds no DESIGN.md or REFERENCE.md),
so a code comment that cites a document, or a link that points into one, must land on a file and a heading that
exist. Pure file reads: no network, no imports of the packages, well under a second.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
README_MAX_LINES = 250
REQUIRED_DOCS = ("architecture.md", "security.md", "benchmarks.md", "operations.md", "limits.md")
CODE_SUFFIXES = {".py", ".toml", ".txt", ".sh", ".cfg", ".ini"}
SKIPPED_DIRS = {".git", ".venv", "__pycache__", "runs", "swarm-data", "node_modules", "build", "dist"}
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
DOC_CITATION = re.compile(r"\bdocs/([A-Za-z0-9_-]+\.md)(?:#([a-z0-9-]+))?")
OUTSIDE_NOTES = re.compile(r"\b(?:DESIGN|REFERENCE)(?:\.md\b|\s*§)")
PAST_WORK = re.compile(r"\b(?:session|round)s? \d+\b", re.IGNORECASE)


def _markdown_files() -> list[Path]:
    return [ROOT / "README.md", *sorted(DOCS.glob("*.md"))]


def _code_files() -> list[Path]:
    """Every code, config and script file of the tree (this test excepted: it names what it forbids)."""
    found = [ROOT / ".ci" / "run", ROOT / "install.sh"]
    for folder, subfolders, files in os.walk(ROOT):
        subfolders[:] = [d for d in subfolders if d not in SKIPPED_DIRS and not d.endswith(".egg-info")
                         and (not d.startswith(".") or d == ".ci")]  # never walk into .venv or caches
        found.extend(Path(folder) / f for f in files if Path(f).suffix in CODE_SUFFIXES)
    return [p for p in found if p.is_file() and p != Path(__file__).resolve()]


def _slug(heading: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation dropped, spaces as hyphens."""
    return re.sub(r"[^a-z0-9 _-]", "", heading.strip().lower()).replace(" ", "-")


def _anchors(markdown: Path) -> set[str]:
    """Anchors of the headings outside fenced code blocks."""
    anchors, fenced = set(), False
    for line in markdown.read_text(encoding="utf-8").splitlines():
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and line.startswith("#"):
            anchors.add(_slug(line.lstrip("#")))
    return anchors


def _links(markdown: Path) -> list[str]:
    """Link targets outside fenced code blocks."""
    targets, fenced = [], False
    for line in markdown.read_text(encoding="utf-8").splitlines():
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced:
            targets.extend(LINK.findall(line))
    return targets


def _unresolved(base: Path, target: str) -> str | None:
    """Why a relative link from `base` does not resolve, or None when it lands on a file (and heading)."""
    if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto: ... are not checked offline
        return None
    path_part, _, anchor = target.partition("#")
    destination = (base.parent / path_part).resolve() if path_part else base
    if not destination.exists():
        return f"{target}: no file {destination.relative_to(ROOT) if destination.is_relative_to(ROOT) else destination}"
    if anchor and destination.suffix == ".md" and anchor not in _anchors(destination):
        return f"{target}: no heading with anchor #{anchor} in {destination.name}"
    return None


def test_the_readme_is_read_in_five_minutes():
    lines = (ROOT / "README.md").read_text(encoding="utf-8").count("\n")
    assert lines <= README_MAX_LINES, f"README.md has {lines} lines; at most {README_MAX_LINES}, the rest in docs/"


def test_the_readme_shows_exactly_the_test_command_ci_runs():
    ci_command = (ROOT / ".ci" / "run").read_text(encoding="utf-8").strip().splitlines()[-1]
    assert ci_command in (ROOT / "README.md").read_text(encoding="utf-8"), f"README.md lacks {ci_command!r}"


@pytest.mark.parametrize("name", REQUIRED_DOCS)
def test_each_document_of_docs_exists_and_says_something(name):
    path = DOCS / name
    assert path.is_file(), f"docs/{name} is missing"
    assert len(path.read_text(encoding="utf-8").strip().splitlines()) >= 10, f"docs/{name} is nearly empty"


def test_every_relative_link_of_the_readme_and_docs_resolves():
    broken = [f"{md.relative_to(ROOT)}: {why}" for md in _markdown_files() for target in _links(md)
              if (why := _unresolved(md, target))]
    assert not broken, "broken links:\n" + "\n".join(broken)


def test_the_readme_links_every_document_of_docs():
    linked = {Path(t.partition("#")[0]).name for t in _links(ROOT / "README.md") if t.startswith("docs/")}
    assert set(REQUIRED_DOCS) <= linked, f"README.md does not link {sorted(set(REQUIRED_DOCS) - linked)}"


def test_no_code_file_cites_notes_that_are_not_in_the_repository():
    citing = [str(p.relative_to(ROOT)) for p in _code_files() if OUTSIDE_NOTES.search(p.read_text(errors="replace"))]
    assert not citing, f"cite docs/ instead of DESIGN.md or REFERENCE.md in: {citing}"


def test_every_docs_citation_in_code_names_a_document_and_heading_that_exist():
    broken = []
    for path in _code_files():
        for name, anchor in DOC_CITATION.findall(path.read_text(errors="replace")):
            why = _unresolved(DOCS / "index", f"{name}#{anchor}" if anchor else name)
            if why:
                broken.append(f"{path.relative_to(ROOT)}: docs/{why}")
    assert not broken, "broken citations:\n" + "\n".join(broken)


def test_no_file_dates_anything_by_numbered_sessions_or_rounds_of_past_work():
    dated = [f"{p.relative_to(ROOT)}: {m.group(0)!r}" for p in [*_code_files(), *_markdown_files()]
             for m in PAST_WORK.finditer(p.read_text(errors="replace"))]
    assert not dated, "history belongs in git log:\n" + "\n".join(dated)


def test_the_link_checker_catches_a_missing_file_and_a_missing_heading():
    """The checks above must be able to fail: a link to a file that is not there, and to a heading that is not."""
    page = DOCS / "architecture.md"
    assert _unresolved(page, "security.md#hostile-peers-network") is None
    assert "no file" in _unresolved(page, "nowhere.md")
    assert "no heading" in _unresolved(page, "security.md#no-such-heading")
    assert _slug(" Learning: SmolLM2-135M") == "learning-smollm2-135m"
    assert OUTSIDE_NOTES.search("as REFERENCE §5 measured") and OUTSIDE_NOTES.search("(DESIGN.md, RolloutGroup)")
    assert not OUTSIDE_NOTES.search("_UNREFERENCED = 3")
    dated = "measured in " + "Ses" + "sion 14"  # split, so that this file does not date itself
    assert PAST_WORK.search(dated) and not PAST_WORK.search("a training session starts")
