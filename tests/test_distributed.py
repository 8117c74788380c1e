"""Data-parallel training under torchrun on torch.distributed (gloo, two CPU processes)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

SCRIPT = Path(__file__).parent / "scripts" / "ddp_training.py"


@pytest.mark.slow
def test_ddp_under_torchrun_keeps_ranks_in_sync_and_averages_evaluation(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PPE_")}
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc_per_node=2",
            str(SCRIPT),
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    ranks = [torch.load(tmp_path / f"rank{r}.pt", weights_only=True) for r in (0, 1)]
    # DDP all-reduced the gradients: both ranks end with the same weights.
    for key, value in ranks[0]["weights"].items():
        assert torch.equal(value, ranks[1]["weights"][key]), key
    assert ranks[0]["iterations"] == ranks[1]["iterations"] == 24  # 32 samples/rank, batch 4
    # distributed=True: every rank reports the mean over both ranks' batches.
    assert ranks[0]["means"] == ranks[1]["means"]
    g = torch.Generator().manual_seed(0)
    x = torch.randn(64, 4, generator=g)[:36]
    t = (x[:, 0] > 0).long()
    fc = torch.nn.Linear(4, 2)
    fc.load_state_dict({k.removeprefix("fc."): v for k, v in ranks[0]["weights"].items()})
    with torch.no_grad():  # 6 equal batches of 6: the global mean of batch means
        expected = torch.nn.functional.cross_entropy(fc(x), t).item()
    assert ranks[0]["means"]["val/loss"] == pytest.approx(expected, rel=1e-5)
    # saver_rank=0: one set of snapshots, written once.
    assert sorted(p.name for p in tmp_path.glob("snapshot_*") if "manifest" not in p.name) == [
        "snapshot_16",
        "snapshot_24",
        "snapshot_8",
    ]
