"""A lost worker under ``torchrun --max-restarts``: the restarted workers resume from the newest
snapshot and the job ends as if nothing had failed (issue 46).

The example's ``--fail-at N`` SIGKILLs the last rank after iteration N on torchrun's first
attempt only (``TORCHELASTIC_RESTART_COUNT`` 0), at a deterministic point, never timed.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from helpers import launch

from ppe_core.testing import _compare_states

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "train_ddp.py"
EPOCHS = "3"  # 16 iterations an epoch with 2 ranks; a snapshot at the end of each


def _final(out: Path) -> dict[str, Any]:
    from ppe_extensions import load_snapshot

    return load_snapshot(str(out / "snapshot_iter_48"))


def _log(out: Path) -> list[dict[str, Any]]:
    return json.loads((out / "log").read_text())


@pytest.fixture(scope="module")
def straight(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("straight")
    code, stderr = launch(EXAMPLE, "--out", str(out), "--epochs", EPOCHS)
    assert code == 0, stderr
    return out


@pytest.mark.slow
def test_a_rank_killed_mid_epoch_is_restarted_and_the_job_ends_as_if_it_never_failed(
    tmp_path: Path, straight: Path
) -> None:
    code, stderr = launch(
        EXAMPLE,
        "--out",
        str(tmp_path),
        "--epochs",
        EPOCHS,
        "--fail-at",
        "23",
        torchrun=("--max-restarts=2",),
        timeout=240,
    )
    assert code == 0, stderr
    assert "exitcode: -9" in stderr  # the first attempt really lost a worker
    assert "connectFullMesh" not in stderr, stderr  # no restart failed to connect
    expected, got = _final(straight), _final(tmp_path)
    for key in ("models", "optimizers"):
        assert _compare_states(expected[key], got[key], strict=True), key
    # Every iteration's entry once, with the straight run's values.
    straight_log, log = _log(straight), _log(tmp_path)
    assert [e["iteration"] for e in log] == [e["iteration"] for e in straight_log]
    for a, b in zip(straight_log, log, strict=True):
        assert a["train/loss"] == b["train/loss"] and a["val/loss"] == b["val/loss"]
