"""The tree stays clean under ruff, configured in pyproject.toml, so every test run (and CI) holds the style line."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent


def test_ruff_finds_nothing():
    result = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", str(REPO_ROOT)],
                            cwd=REPO_ROOT, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, f"ruff check found problems:\n{result.stdout}{result.stderr}"
