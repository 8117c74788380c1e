"""Distributed resume under torchrun (gloo, two processes): bit-exact with per-rank randomness,
world-size mismatches reported, and snapshots on some ranks only never hang."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from helpers import launch
from ppe_extensions._snapshot import load_snapshot

import ppe_core as ppe

SCRIPTS = Path(__file__).parent / "scripts"
RESUME = SCRIPTS / "ddp_resume.py"
PPE_PATTERN = SCRIPTS / "ddp_ppe_pattern.py"
sys.path.insert(0, str(SCRIPTS))
import ddp_resume  # noqa: E402  (the script's model and data, for the single-process check)


def results(out: Path, ranks: int = 2) -> list[dict[str, Any]]:
    return [torch.load(out / f"rank{r}.pt", weights_only=True) for r in range(ranks)]


def assert_same_run(resumed: dict[str, Any], straight: dict[str, Any], rank: int) -> None:
    for key, value in straight["weights"].items():
        assert torch.equal(resumed["weights"][key], value), (rank, key)
    for key, value in straight["rng"].items():
        assert torch.equal(resumed["rng"][key], value), (rank, key)
    assert resumed["iteration"] == straight["iteration"] == 32
    if rank == 0:  # the log rank 0 writes, elapsed times left out
        assert resumed["log"] == straight["log"]
        assert [entry["iteration"] for entry in resumed["log"]] == [8, 16, 24, 32]


def copy_snapshot(source: Path, name: str, target: Path) -> None:
    target.mkdir()
    for file in (name, f".{name}.manifest.json"):
        shutil.copy(source / file, target / file)


@pytest.fixture(scope="module")
def straight(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    """Four epochs without interruption, two ranks."""
    out = tmp_path_factory.mktemp("straight")
    code, stderr = launch(RESUME, str(out))
    assert code == 0, stderr[-4000:]
    return results(out)


@pytest.fixture(scope="module")
def stopped(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The same run stopped at iteration 20 (mid-epoch 3), with snapshots every 4 iterations."""
    out = tmp_path_factory.mktemp("stopped")
    code, stderr = launch(RESUME, str(out), "--stop-at", "20")
    assert code == 0, stderr[-4000:]
    return out


@pytest.mark.slow
def test_ddp_resume_after_two_epochs_is_bit_exact_on_every_rank(
    straight: list[dict[str, Any]], stopped: Path, tmp_path: Path
) -> None:
    # Dropout, per-sample noise from torch/numpy/random, an uneven validation split and
    # per-rank seeds: each rank's RNG states differ, and each must resume with its own.
    assert not torch.equal(straight[0]["rng"]["torch"], straight[1]["rng"]["torch"])
    copy_snapshot(stopped, "snapshot_16", tmp_path / "run")  # the end of epoch 2
    code, stderr = launch(RESUME, str(tmp_path / "run"))
    assert code == 0, stderr[-4000:]
    for rank, (resumed, reference) in enumerate(
        zip(results(tmp_path / "run"), straight, strict=True)
    ):
        assert resumed["loaded_from"] == "snapshot_16", rank
        assert_same_run(resumed, reference, rank)


@pytest.mark.slow
def test_ddp_resume_mid_epoch_is_bit_exact_on_every_rank(
    straight: list[dict[str, Any]], stopped: Path
) -> None:
    code, stderr = launch(RESUME, str(stopped))  # resumes from snapshot_20, mid-epoch 3
    assert code == 0, stderr[-4000:]
    for rank, (resumed, reference) in enumerate(zip(results(stopped), straight, strict=True)):
        assert resumed["loaded_from"] == "snapshot_20", rank
        assert_same_run(resumed, reference, rank)
    state = load_snapshot(str(stopped / "snapshot_20"))
    internal = state["_ppe_core"]
    assert internal["world_size"] == 2
    assert len(internal["ranks"]) == 2  # every rank's own RNG and loader states
    assert not torch.equal(
        internal["ranks"][0]["trainer_state"]["torch"],
        internal["ranks"][1]["trainer_state"]["torch"],
    )


@pytest.mark.slow
def test_single_process_snapshot_resumed_by_two_ranks_warns_naming_both_sizes(
    tmp_path: Path,
) -> None:
    code, stderr = launch(RESUME, str(tmp_path), "--epochs", "1", processes=0)
    assert code == 0, stderr[-4000:]
    code, stderr = launch(RESUME, str(tmp_path), "--epochs", "3")
    assert code == 0, stderr[-4000:]
    warned = [line for line in stderr.splitlines() if "WorldSizeMismatchWarning" in line]
    assert len(warned) == 2, stderr[-4000:]  # on each rank
    assert "saved by a run of 1 process(es) and this run has 2" in warned[0]
    assert "Resumed exactly: the weights, the optimizer states and the iteration" in stderr
    assert "Not resumed exactly: each rank's RNG states and loader position" in stderr
    ranks = results(tmp_path)
    # One process: 16 batches of 4 per epoch; two ranks: 8 each, so iteration 16 is epoch 2.
    assert [r["loaded_from"] for r in ranks] == ["snapshot_16", "snapshot_16"]
    assert ranks[0]["iteration"] == ranks[1]["iteration"] == 16 + 8


@pytest.mark.slow
def test_two_rank_snapshot_resumed_by_one_process_warns(stopped: Path, tmp_path: Path) -> None:
    from ppe_core.errors import WorldSizeMismatchWarning  # here: the other tests run on main

    copy_snapshot(stopped, "snapshot_16", tmp_path / "run")
    model = ppe.to(ddp_resume.Net(), "cpu")
    snapshot = ppe.training.extensions.snapshot(autoload=True, filename="snapshot_{.iteration}")
    trainer = ppe.engine.create_trainer(
        model,
        torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
        3,
        out_dir=str(tmp_path / "run"),
        extensions=[snapshot],
    )
    train, _ = ddp_resume.datasets()
    with pytest.warns(WorldSizeMismatchWarning, match=r"2 process\(es\) and this run has 1"):
        trainer.run(torch.utils.data.DataLoader(train, batch_size=8))
    assert trainer.iteration == 24  # weights, optimizer and counts resumed: 16 + 8 more


@pytest.mark.slow
def test_ppe_pattern_with_extensions_on_rank_0_only_trains_to_the_end(tmp_path: Path) -> None:
    code, stderr = launch(PPE_PATTERN, str(tmp_path), timeout=90)
    assert code == 0, stderr[-4000:]
    rank0, rank1 = results(tmp_path)
    assert rank0["iteration"] == rank1["iteration"] == 18  # 3 epochs of 6 batches
    for key, value in rank0["weights"].items():
        assert torch.equal(value, rank1["weights"][key]), key
    assert sorted(p.name for p in tmp_path.glob("snapshot_iter_*")) == [
        "snapshot_iter_12",
        "snapshot_iter_18",
        "snapshot_iter_6",
    ]
    # Rank 0 is told once that its snapshots hold its own RNG states only.
    assert stderr.count("SnapshotRanksWarning") == 1, stderr[-4000:]
    assert "registered on ranks [0] but not on ranks [1]" in stderr
    assert "bit-exact on rank 0 only" in stderr
    # Autoloading on rank 0 only would resume rank 0 alone: a clear error, not diverging ranks.
    code, stderr = launch(PPE_PATTERN, str(tmp_path), "--autoload", timeout=90)
    assert code != 0
    assert "SnapshotRanksError" in stderr, stderr[-4000:]
    assert "found" in stderr and "snapshot_iter_18 to resume from" in stderr


@pytest.mark.slow
def test_distributed_mode_on_rank_0_only_fails_at_start_instead_of_hanging(
    tmp_path: Path,
) -> None:
    code, stderr = launch(PPE_PATTERN, str(tmp_path), "--mode", "distributed", timeout=90)
    assert code != 0
    assert "SnapshotRanksError" in stderr, stderr[-4000:]
    assert "SnapshotMode.DISTRIBUTED) is registered on ranks [0] but not on ranks [1]" in stderr
    assert not list(tmp_path.glob("snapshot_iter_*"))


def test_a_snapshot_at_the_stop_iteration_does_not_swallow_the_stop(tmp_path: Path) -> None:
    # The snapshot asks manager.stop_trigger (to save its last one in the training thread)
    # before the manager's own check at the same iteration; the stop must still count.
    model = ppe.to(ddp_resume.Net(), "cpu")
    snapshot = ppe.training.extensions.snapshot(filename="snapshot_{.iteration}")
    trainer = ppe.engine.create_trainer(
        model,
        torch.optim.SGD(model.parameters(), lr=0.1),
        4,
        stop_trigger=(20, "iteration"),
        out_dir=str(tmp_path),
    )
    trainer.extend(snapshot, trigger=(4, "iteration"))
    train, _ = ddp_resume.datasets()
    trainer.run(torch.utils.data.DataLoader(train, batch_size=4))  # 16 batches per epoch
    assert trainer.iteration == 20
    assert (tmp_path / "snapshot_20").exists()
    assert not (tmp_path / "snapshot_24").exists()
