"""ppe-extensions' tests run with ppe-core and this package alone (no core test helpers)."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(autouse=True)
def _run_in_tmp_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Run each test in its own directory: default out_dir="result" lands there."""
    monkeypatch.chdir(tmp_path)
