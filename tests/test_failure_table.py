"""docs/operations.md's table of failures names, for each case, a test that exists: the table cannot drift from
what is checked."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
NAMED_TEST = re.compile(r"`(tests/(?:[a-z0-9_]+/)?test_[a-z0-9_]+\.py)::(test_[a-z0-9_]+)`")


def _table_rows() -> list[str]:
    text = (ROOT / "docs" / "operations.md").read_text(encoding="utf-8")
    section = text.split("### When something fails", 1)[1].split("\n#", 1)[0]
    return [line for line in section.splitlines() if line.startswith("| ") and not line.startswith("| case")]


def test_every_case_names_a_test_that_exists():
    rows = _table_rows()
    assert len(rows) >= 10
    for row in rows:
        named = NAMED_TEST.findall(row.rsplit("|", 2)[-2])
        assert named, f"no test named in: {row}"
        for path, name in named:
            source = (ROOT / path).read_text(encoding="utf-8")
            assert re.search(rf"^(async )?def {name}\(", source, re.MULTILINE), f"{path}::{name} does not exist"
