"""The README's main example ("Trainer at a glance") run as a user runs it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

EXAMPLE = Path(__file__).parent.parent / "examples" / "quickstart.py"


def test_quickstart_prints_the_table_shows_progress_and_writes_the_log(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PPE_")}
    result = subprocess.run(
        [sys.executable, str(EXAMPLE)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    header = [line for line in lines if line.startswith("epoch")]
    assert len(header) == 1
    assert header[0].split() == ["epoch", "iteration", "train/loss", "val/loss", "val/accuracy"]
    rows = [line.split() for line in lines if line[:1].isdigit() and len(line.split()) == 5]
    assert [int(row[0]) for row in rows] == list(range(1, 11))
    # Progress: plain lines (stdout is a pipe here), ending at 100 %, and a validation line
    # with the real number of batches each epoch.
    progress = [line for line in lines if "iters (" in line]
    assert progress and "320/320 iters (100.00%)" in progress[-1]
    assert not any("\r" in line or "\x1b[" in line for line in lines)
    assert sum("validation: 8/8 batches" in line for line in lines) == 10
    log = json.loads((tmp_path / "result" / "log").read_text())
    assert len(log) == 10
    for entry in log:
        assert {"epoch", "iteration", "train/loss", "val/loss"} <= set(entry)
    assert log[-1]["val/loss"] < log[0]["val/loss"]
