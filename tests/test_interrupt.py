"""SIGTERM/SIGINT (preemption, Ctrl-C): stop after the iteration, snapshot, resume bit-exactly.

The script (tests/scripts/interrupted_training.py) has ``kill`` signal its whole process
group mid-epoch, DataLoader workers included, as a scheduler does.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from helpers import launch

SCRIPT = Path(__file__).parent / "scripts" / "interrupted_training.py"
LINE = "interrupted at iteration {}; snapshot_iter_{} written; rerun to resume"


def _run(out: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    """One process in a session of its own (the group the script signals)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PPE_")}
    env["OMP_NUM_THREADS"] = "1"
    return subprocess.run(
        [sys.executable, str(SCRIPT), str(out), "--workers", "2", *extra],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        start_new_session=True,
    )


def _snapshots(out: Path) -> list[str]:
    return sorted(p.name for p in out.iterdir() if p.name.startswith("snapshot_iter_"))


def _assert_same_weights(a: Path, b: Path) -> None:
    expected, got = torch.load(a, weights_only=True), torch.load(b, weights_only=True)
    assert expected.keys() == got.keys()
    for key in expected:
        assert torch.equal(expected[key], got[key]), f"{key} differs after the resume"


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("straight")
    result = _run(out)
    assert result.returncode == 0, result.stderr
    return out / "final0.pt"


@pytest.mark.slow
@pytest.mark.parametrize("name", ["TERM", "INT"])
def test_signal_mid_epoch_snapshots_exits_and_resumes_bit_exactly(
    tmp_path: Path, reference: Path, name: str
) -> None:
    interrupted = _run(tmp_path, "--signal", name, "--at", "13")
    assert interrupted.returncode == 128 + getattr(signal, f"SIG{name}"), interrupted.stderr
    assert LINE.format(13, 13) in interrupted.stderr
    assert "Traceback" not in interrupted.stderr  # neither a KeyboardInterrupt nor a worker's
    assert _snapshots(tmp_path) == ["snapshot_iter_13", "snapshot_iter_7"]
    resumed = _run(tmp_path)
    assert resumed.returncode == 0, resumed.stderr
    _assert_same_weights(reference, tmp_path / "final0.pt")


@pytest.mark.slow
def test_second_signal_exits_at_once_without_snapshot(tmp_path: Path) -> None:
    result = _run(tmp_path, "--at", "13", "--twice")
    assert "survived the first signal" in result.stdout  # the first only set the flag
    assert result.returncode == -signal.SIGTERM  # the default disposition: killed by it
    assert "interrupted at" not in result.stderr
    assert _snapshots(tmp_path) == ["snapshot_iter_7"]
    # Its DataLoader workers (which ignore the signals) followed it: none outlives it long.
    deadline = time.monotonic() + 15
    while _processes_of(tmp_path) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not _processes_of(tmp_path), "DataLoader workers outlived the killed trainer"


def _processes_of(out: Path) -> list[int]:
    """Pids of processes whose command line names ``out`` (the script and its workers)."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            line = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except (OSError, ValueError):
            continue
        if entry.name.isdigit() and str(out) in line:
            found.append(int(entry.name))
    return found


@pytest.fixture(scope="module")
def distributed_reference(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("straight_ddp")
    code, stderr = launch(SCRIPT, str(out), "--workers", "2")
    assert code == 0, stderr
    return out


@pytest.mark.slow
def test_torchrun_ranks_signalled_at_different_iterations_stop_together(
    tmp_path: Path, distributed_reference: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PPE_INTERRUPT_CHECK_EVERY", "4")
    # Each rank's group (torchrun gives each worker a session) is signalled: rank 0 after
    # iteration 13, rank 1 after 14; they agree at 16, the next multiple of 4.
    code, stderr = launch(SCRIPT, str(tmp_path), "--workers", "2", "--at", "13", "14")
    assert code != 0, stderr
    assert "exitcode: 143" in stderr, stderr[-3000:]
    assert stderr.count(LINE.format(16, 16)) == 1  # rank 0 says it
    assert _snapshots(tmp_path) == ["snapshot_iter_14", "snapshot_iter_16", "snapshot_iter_7"]
    code, stderr = launch(SCRIPT, str(tmp_path), "--workers", "2")
    assert code == 0, stderr
    for rank in (0, 1):
        _assert_same_weights(
            distributed_reference / f"final{rank}.pt", tmp_path / f"final{rank}.pt"
        )


@pytest.mark.slow
def test_torchrun_peer_killed_the_other_rank_exits_fast_without_snapshot(tmp_path: Path) -> None:
    # Rank 1 is SIGKILLed after iteration 9; torchrun's agent then sends SIGTERM to rank 0,
    # whose next collective fails: it exits with 143 at once, writing nothing.
    code, stderr = launch(SCRIPT, str(tmp_path), "--workers", "2", "--die-at", "9", timeout=60)
    assert code != 0
    assert "exitcode  : 143" in stderr, stderr[-3000:]
    assert "interrupted at iteration 9; training failed after the signal" in stderr
    assert _snapshots(tmp_path) == ["snapshot_iter_7"]
