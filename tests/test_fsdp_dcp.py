"""``SnapshotMode.DCP``: FSDP2 snapshots on torch.distributed.checkpoint, saved asynchronously,
atomic (a kill during a save leaves the previous one), verified (a damaged shard is skipped)
and resharded on load. Under torchrun (gloo) with ``scripts/fsdp_training.py --mode dcp``;
the file helpers alone, without processes."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from helpers import launch

from ppe_core.errors import SnapshotError, SnapshotVerificationWarning
from ppe_core.training.extensions import _snapshot_dcp as files

SCRIPTS = Path(__file__).parent / "scripts"
FSDP = SCRIPTS / "fsdp_training.py"
sys.path.insert(0, str(SCRIPTS))


def results(out: Path, phase: str, ranks: int = 2) -> list[dict[str, Any]]:
    return [torch.load(out / f"{phase}_rank{r}.pt", weights_only=True) for r in range(ranks)]


def run_phase(out: Path, *args: str, processes: int = 2, code: int = 0) -> str:
    returned, stderr = launch(FSDP, str(out), "--mode", "dcp", *args, processes=processes)
    assert (returned == 0) == (code == 0), stderr[-4000:]
    return stderr


def assert_same_run(resumed: dict[str, Any], straight: dict[str, Any], rank: int) -> None:
    assert resumed["iteration"] == straight["iteration"] == 16, rank
    for key, value in straight["weights"].items():
        assert torch.equal(resumed["weights"][key], value), (rank, key)
    assert torch.equal(resumed["rng"], straight["rng"]), rank


@pytest.fixture(scope="module")
def first(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """2 ranks: the straight run and the run stopped at iteration 12 (snapshots every 4),
    with copies of the stopped run taken before anything resumes it."""
    out = tmp_path_factory.mktemp("dcp")
    run_phase(out)
    for copy in ("world1", "damaged"):
        shutil.copytree(out / "run", out / copy / "run")
    return out


@pytest.fixture(scope="module")
def straight(first: Path) -> list[dict[str, Any]]:
    return [result["straight"] for result in results(first, "first")]


@pytest.mark.slow
def test_dcp_snapshot_resumes_mid_epoch_bit_exactly_and_reports_blocked_time(
    first: Path, straight: list[dict[str, Any]]
) -> None:
    run = first / "run"
    assert sorted(p.name for p in run.iterdir() if not p.name.startswith(".")) == [
        "snapshot_12",
        "snapshot_4",
        "snapshot_8",
    ]
    manifest = files.verify(str(run / "snapshot_12"))
    assert manifest["world_size"] == 2 and manifest["iteration"] == 12
    # each rank its shards, DCP's metadata and each rank's other state
    assert set(manifest["files"]) == {
        ".metadata",
        "__0_0.distcp",
        "__1_0.distcp",
        "rank0.pt",
        "rank1.pt",
    }
    run_phase(first, "--phase", "resume")
    assert not torch.equal(straight[0]["rng"], straight[1]["rng"])  # per-rank dropout seeds
    for rank, result in enumerate(results(first, "resume")):
        assert result["resumed"]["loaded_from"] == "snapshot_12"
        assert_same_run(result["resumed"], straight[rank], rank)
    for rank, run_result in enumerate(straight):  # one per snapshot, the staging wait added
        blocked = run_result["blocked_times"]
        assert [iteration for iteration, _ in blocked] == [4, 8, 12, 16], rank
        assert all(0 < seconds < 5 for _, seconds in blocked), blocked


@pytest.mark.slow
def test_dcp_snapshot_of_two_ranks_loads_resharded_into_one_process(first: Path) -> None:
    out = first / "world1"
    stderr = run_phase(out, "--phase", "load", processes=1)
    (result,) = results(out, "load", 1)
    loaded = result["loaded"]
    assert loaded["loaded_from"] == "snapshot_12" and loaded["iteration"] == 12
    stopped = results(first, "first")[0]["stopped"]  # its weights are snapshot_12's
    for key, value in stopped["weights"].items():
        assert torch.equal(loaded["weights"][key], value), key
    # The weights resume exactly; each rank's RNG and loader position only approximately.
    assert "WorldSizeMismatchWarning" in stderr and "2 process(es) and this run has 1" in stderr


@pytest.mark.slow
def test_a_damaged_shard_is_skipped_and_resume_falls_back_bit_exactly(
    first: Path, straight: list[dict[str, Any]]
) -> None:
    out = first / "damaged"
    shard = out / "run" / "snapshot_12" / "__1_0.distcp"
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 1
    shard.write_bytes(data)
    stderr = run_phase(out, "--phase", "resume")
    assert "SnapshotVerificationWarning" in stderr and "__1_0.distcp is damaged" in stderr
    for rank, result in enumerate(results(out, "resume")):
        assert result["resumed"]["loaded_from"] == "snapshot_8", rank
        assert_same_run(result["resumed"], straight[rank], rank)


@pytest.mark.slow
def test_a_kill_during_an_async_save_leaves_the_previous_snapshot_and_resume_is_bit_exact(
    tmp_path: Path, straight: list[dict[str, Any]]
) -> None:
    # Both ranks SIGKILLed at iteration 10, while snapshot_8's save is unfinished (its data
    # written, its manifest held back).
    run_phase(tmp_path, "--phase", "kill", code=1)
    run = tmp_path / "run"
    assert sorted(p.name for p in run.iterdir() if p.is_dir()) == [
        ".snapshot_8.dcp-tmp",
        "snapshot_4",
    ]
    run_phase(tmp_path, "--phase", "resume")
    assert not (run / ".snapshot_8.dcp-tmp").exists()  # removed when the run started
    for rank, result in enumerate(results(tmp_path, "resume")):
        assert result["resumed"]["loaded_from"] == "snapshot_4", rank
        assert_same_run(result["resumed"], straight[rank], rank)


def _snapshot_dir(out: Path, name: str, iteration: int) -> Path:
    directory = out / name
    directory.mkdir(parents=True)
    (directory / "__0_0.distcp").write_bytes(b"shard" * 100)
    (directory / "rank0.pt").write_bytes(b"rest")
    files.write_manifest(str(directory), iteration, 1)
    return directory


def test_verify_finds_damaged_missing_and_unlisted_files(tmp_path: Path) -> None:
    directory = _snapshot_dir(tmp_path, "snapshot_4", 4)
    assert files.verify(str(directory))["files"]["__0_0.distcp"]["size"] == 500
    (directory / "extra").write_bytes(b"")
    with pytest.raises(SnapshotError, match=r"not listed: \['extra'\]"):
        files.verify(str(directory))
    (directory / "extra").unlink()
    (directory / "rank0.pt").write_bytes(b"REST")  # same size, other bytes
    with pytest.raises(SnapshotError, match=r"rank0\.pt is damaged"):
        files.verify(str(directory))
    (directory / "rank0.pt").unlink()
    with pytest.raises(SnapshotError, match=r"missing: \['rank0.pt'\]"):
        files.verify(str(directory))
    (directory / files.MANIFEST_NAME).write_text("{")
    with pytest.raises(SnapshotError, match="no readable snapshot manifest"):
        files.verify(str(directory))


def test_newest_valid_falls_back_retain_keeps_the_newest_and_leftovers_go(tmp_path: Path) -> None:
    template = "snapshot_{.iteration}"
    for iteration in (4, 8, 12):
        _snapshot_dir(tmp_path, f"snapshot_{iteration}", iteration)
    (tmp_path / "snapshot_12" / "__0_0.distcp").write_bytes(b"x" * 500)
    with pytest.warns(SnapshotVerificationWarning, match="snapshot_12.*damaged"):
        assert files.newest_valid(str(tmp_path), template) == str(tmp_path / "snapshot_8")
    leftover = Path(files.temporary_dir(str(tmp_path / "snapshot_16")))
    leftover.mkdir()
    files.remove_leftovers(str(tmp_path), template)
    assert not leftover.exists()
    files.retain(str(tmp_path), template, 2)
    assert sorted(os.listdir(tmp_path)) == ["snapshot_12", "snapshot_8"]


def test_publish_renames_into_place_and_replaces_an_older_directory(tmp_path: Path) -> None:
    final = tmp_path / "snapshot_4"
    for content in (b"old", b"new"):
        temporary = Path(files.temporary_dir(str(final)))
        temporary.mkdir()
        (temporary / "rank0.pt").write_bytes(content)
        files.publish(str(temporary), str(final))
        assert not temporary.exists()
    assert (final / "rank0.pt").read_bytes() == b"new"
    assert sorted(os.listdir(tmp_path)) == ["snapshot_4"]
