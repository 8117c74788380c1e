"""``export-snapshot`` with an output it cannot or must not write: exit code 1 and one line
naming the problem and the fix (no traceback), refused before the snapshot is read; an output
inside the snapshot directory is refused and the snapshot stays intact."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from test_snapshot_dcp_promises import runs  # noqa: F401  (a DCP snapshot run, one process)

from ppe_core.__main__ import main as cli
from ppe_core.training.extensions import _snapshot_dcp as files


def _export(capsys: pytest.CaptureFixture[str], snapshot: Path, output: Path) -> str:
    """Runs the CLI expecting a refusal; its one-line message."""
    assert cli(["export-snapshot", str(snapshot), str(output)]) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    (line,) = captured.err.splitlines()
    assert " export-snapshot: error: " in line and "Traceback" not in captured.err
    return line


@pytest.fixture
def snapshot(runs: tuple[Any, Path], tmp_path: Path) -> Path:  # noqa: F811
    return Path(shutil.copytree(runs[1] / "snapshot_iter_4", tmp_path / "snapshot_iter_4"))


def test_an_output_in_a_missing_directory_is_refused_naming_it(
    snapshot: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    line = _export(capsys, snapshot, tmp_path / "exports" / "model.pt")
    assert f"its directory {tmp_path / 'exports'} does not exist; create the directory" in line


def test_an_output_under_a_regular_file_is_refused_naming_it(
    snapshot: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "notes").write_text("not a directory")
    line = _export(capsys, snapshot, tmp_path / "notes" / "model.pt")
    assert f"its directory {tmp_path / 'notes'} is not a directory" in line


def _unwritable_as_root(directory: Path) -> Callable[[], object] | None:
    """Makes ``directory`` unwritable even to root (immutable); the undo, or None."""
    if shutil.which("chattr") is None:
        return None
    if subprocess.run(["chattr", "+i", str(directory)], capture_output=True).returncode:
        return None  # no CAP_LINUX_IMMUTABLE, or a file system without the flag
    return lambda: subprocess.run(["chattr", "-i", str(directory)], check=True)


@pytest.fixture
def unwritable(tmp_path: Path) -> Iterator[Path]:
    """A directory this process cannot create files in: mode 0o500, or immutable as root."""
    directory = tmp_path / "locked"
    directory.mkdir()
    if os.geteuid() != 0:
        directory.chmod(0o500)
        yield directory
        directory.chmod(0o700)
        return
    undo = _unwritable_as_root(directory)
    if undo is None:
        pytest.skip("as root, only an immutable directory (chattr +i) refuses writes")
    try:
        yield directory
    finally:
        undo()


def test_an_output_without_permission_is_refused_naming_the_directory(
    snapshot: Path, unwritable: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    line = _export(capsys, snapshot, unwritable / "model.pt")
    assert f"no permission to create files in {unwritable}" in line
    assert os.listdir(unwritable) == []


@pytest.mark.parametrize("name", ["model.pt", "rank0.pt", "."])
def test_an_output_inside_the_snapshot_is_refused_and_the_snapshot_stays_intact(
    snapshot: Path, capsys: pytest.CaptureFixture[str], name: str
) -> None:
    before = sorted(os.listdir(snapshot))
    line = _export(capsys, snapshot, snapshot / name)
    assert f"inside the snapshot directory {snapshot}" in line
    assert "Write the export elsewhere" in line
    assert sorted(os.listdir(snapshot)) == before
    assert files.verify(str(snapshot))["iteration"] == 4


def test_an_output_that_is_a_directory_is_refused_naming_a_file_to_write(
    snapshot: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    line = _export(capsys, snapshot, tmp_path)
    assert f"it is a directory; name the file to write, e.g. {tmp_path / 'model.pt'}" in line
