"""Crash safety end to end: SIGKILL a real training process repeatedly, resume bit-exactly."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

SCRIPT = Path(__file__).parent / "scripts" / "resumable_training.py"
LAST_ITERATION = 60  # 6 epochs x 10 iterations


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("PPE_")}


def _run_to_end(out: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(
        [sys.executable, str(SCRIPT), str(out), *extra],
        capture_output=True,
        text=True,
        timeout=300,
        env=_env(),
    )
    assert result.returncode == 0, result.stderr
    return result


def _run_and_kill_at(out: Path, iteration: int, *extra: str) -> int:
    """Start a run and SIGKILL it as soon as it reports ``iteration``; return where it was."""
    proc = subprocess.Popen(
        [sys.executable, str(SCRIPT), str(out), *extra],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env=_env(),
    )
    assert proc.stdout is not None
    seen = -1
    deadline = time.monotonic() + 300
    for line in proc.stdout:
        if line.startswith("iteration "):
            seen = int(line.split()[1])
            if seen >= iteration:
                os.kill(proc.pid, signal.SIGKILL)  # mid-step, mid-snapshot: wherever it is
                break
        assert time.monotonic() < deadline
    proc.wait(timeout=60)
    proc.stdout.close()
    return seen


def _weights(out: Path) -> dict[str, torch.Tensor]:
    return torch.load(out / "final.pt", weights_only=True)


def _assert_identical(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), f"{key} differs after resume"


@pytest.mark.slow
@pytest.mark.parametrize("workers", ["0", "2"])
def test_sigkill_three_times_then_resume_gives_bit_identical_weights(
    tmp_path: Path, workers: str
) -> None:
    reference = tmp_path / "reference"
    _run_to_end(reference, "--workers", workers)

    crashed = tmp_path / "crashed"
    rng = random.Random(20261202 + int(workers))
    # Kill points climb through the run, each at a random iteration (snapshots every 7, so
    # most kills lose work since the last snapshot and some land while one is being written).
    targets = sorted(rng.sample(range(5, LAST_ITERATION - 2), 3))
    reached = [_run_and_kill_at(crashed, target, "--workers", workers) for target in targets]
    assert reached == targets  # each run got there: the previous ones resumed, not restarted
    result = _run_to_end(crashed, "--workers", workers)
    first = int(result.stdout.split("\n", 1)[0].split()[1])
    assert first > 1, "the final run resumed from a snapshot"
    _assert_identical(_weights(reference), _weights(crashed))
    # The log holds every interval exactly once, with the reference's values.
    import json

    ref_log = json.loads((reference / "log").read_text())
    log = json.loads((crashed / "log").read_text())
    assert [e["iteration"] for e in log] == [e["iteration"] for e in ref_log]
    assert [e["train/loss"] for e in log] == [e["train/loss"] for e in ref_log]
