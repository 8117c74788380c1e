"""``export-snapshot`` with an output it cannot or must not write: exit code 1 and one line
naming the problem and the fix (no traceback), refused before the snapshot is read; an output
inside the snapshot directory is refused and the snapshot stays intact. Default-mode snapshot
files export too (a PPE-written one, without a manifest, marked unverified), and a missing
path says "not found"."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from ppe_extensions import _snapshot_dcp as files
from ppe_extensions._snapshot import manifest_path
from test_snapshot_dcp_promises import runs  # noqa: F401  (a DCP snapshot run, one process)

import ppe_core as ppe
from ppe_core.__main__ import main as cli


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


# Issue 45.5: default-mode snapshots (one file) export too; a missing path says "not found" ----


class _Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(3, 2)

    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"loss": self.fc(x).pow(2).mean()}


def _batches() -> list[dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(0)
    return [{"x": torch.randn(4, 3, generator=g)} for _ in range(3)]


@pytest.fixture(scope="module")
def default_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, torch.Tensor], Path]:
    """A default-mode snapshot of a trained model, and the model's weights."""
    out = tmp_path_factory.mktemp("default")
    torch.manual_seed(0)
    model = ppe.to(_Net(), "cpu")
    trainer = ppe.engine.create_trainer(
        model, torch.optim.SGD(model.parameters(), lr=0.1), 1, out_dir=str(out)
    )
    trainer.extend(ppe.training.extensions.snapshot())
    trainer.run(_batches())
    return {k: v.clone() for k, v in model.state_dict().items()}, out / "snapshot_iter_3"


def test_a_default_mode_snapshot_exports_the_models_plain_state_dict(
    default_run: tuple[dict[str, torch.Tensor], Path],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    weights, snapshot = default_run
    assert cli(["export-snapshot", str(snapshot), str(tmp_path / "model.pt")]) == 0
    captured = capsys.readouterr()
    assert captured.out == f"wrote {tmp_path / 'model.pt'}: 2 tensors, 0.0 MB\n"
    assert captured.err == ""
    model = _Net()
    model.load_state_dict(torch.load(tmp_path / "model.pt", weights_only=True))
    assert all(torch.equal(v, weights[k]) for k, v in model.state_dict().items())


def test_a_damaged_default_mode_snapshot_is_refused(
    default_run: tuple[dict[str, torch.Tensor], Path],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    damaged = tmp_path / "snapshot_iter_3"
    shutil.copy(default_run[1], damaged)
    shutil.copy(manifest_path(default_run[1]), manifest_path(damaged))
    data = bytearray(damaged.read_bytes())
    data[len(data) // 2] ^= 0xFF
    damaged.write_bytes(bytes(data))
    line = _export(capsys, damaged, tmp_path / "model.pt")
    assert f"refusing to export {damaged}: it does not verify" in line
    assert "SHA-256 differs" in line
    assert not (tmp_path / "model.pt").exists()


def test_a_snapshot_written_by_ppe_is_exported_marked_unverified(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import pytorch_pfn_extras as real_ppe

    torch.manual_seed(0)
    model = _Net()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    manager = real_ppe.training.ExtensionsManager(
        model,
        optimizer,
        1,
        iters_per_epoch=3,
        out_dir=str(tmp_path / "ppe"),
        extensions=[real_ppe.training.extensions.snapshot()],
    )
    for batch in _batches():
        with manager.run_iteration(step_optimizers=["main"]):
            model(**batch)["loss"].backward()
    snapshot = tmp_path / "ppe" / "snapshot_iter_3"
    assert not os.path.exists(manifest_path(snapshot))
    assert cli(["export-snapshot", str(snapshot), str(tmp_path / "model.pt")]) == 0
    captured = capsys.readouterr()
    assert captured.out.endswith("(unverified: the snapshot has no manifest)\n")
    assert f"warning: {snapshot} has no manifest" in captured.err
    assert "exported unverified" in captured.err
    exported = torch.load(tmp_path / "model.pt", weights_only=True)
    assert all(torch.equal(v, exported[k]) for k, v in model.state_dict().items())


def test_a_missing_path_says_not_found(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    missing = tmp_path / "result" / "snapshot_iter_12"
    line = _export(capsys, missing, tmp_path / "model.pt")
    assert f"{missing} not found: there is no such file or directory" in line
    assert "verify" not in line
