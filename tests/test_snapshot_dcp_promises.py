"""``SnapshotMode.DCP`` keeps the default mode's promises: a bad manifest is skipped with a
warning naming the snapshot, an unfinished save of a dead run is removed at the next start
(autoload or not), a full disk is a ``DiskFullError`` naming the snapshot with nothing left
behind, a snapshot of another architecture is a ``SnapshotError`` naming the keys, and stray
files inside a snapshot directory are ignored. One process, a one-process gloo group."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from ppe_extensions import _snapshot_dcp as files
from test_snapshot_leftovers import _can_mount_tmpfs

import ppe_core as ppe
from ppe_core.errors import SnapshotError, SnapshotVerificationWarning
from ppe_core.writing import HOST_TAG as _HOST_TAG

E = ppe.training.extensions
SCRIPTS = Path(__file__).parent / "scripts"


class Net(torch.nn.Module):
    def __init__(self, outputs: int = 2, hidden: bool = False) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(3, outputs)
        self.extra = torch.nn.Linear(outputs, outputs) if hidden else None

    def forward(self, x: torch.Tensor, t: torch.Tensor) -> dict[str, torch.Tensor]:
        y = self.fc(x)
        y = y if self.extra is None else self.extra(y)
        return {"loss": torch.nn.functional.cross_entropy(y, t % y.shape[1])}


DATA = [
    {"x": torch.randn(4, 3, generator=torch.Generator().manual_seed(i)), "t": torch.arange(4) % 2}
    for i in range(6)
]


def train(
    out: Path, *, stop: int | None = None, autoload: bool = True, **net: Any
) -> tuple[Any, dict[str, torch.Tensor]]:
    """6 iterations (one epoch), a DCP snapshot every 2; the snapshot extension and the
    final weights back."""
    torch.manual_seed(0)
    model = ppe.to(Net(**net), "cpu")
    snap = E.snapshot(saver_rank=0, snapshot_mode=E.SnapshotMode.DCP, autoload=autoload)
    trainer = ppe.engine.create_trainer(
        model,
        torch.optim.Adam(model.parameters(), lr=0.1),
        1,
        out_dir=str(out),
        stop_trigger=None if stop is None else (stop, "iteration"),
    )
    trainer.extend(snap, trigger=(2, "iteration"))
    trainer.run(DATA)
    return snap, {k: v.clone() for k, v in model.state_dict().items()}


@contextlib.contextmanager
def one_process_group(store: Path) -> Iterator[None]:
    """A one-process gloo group (what SnapshotMode.DCP needs), destroyed after."""
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{store}", world_size=1, rank=0)
    try:
        yield
    finally:
        dist.destroy_process_group()


@pytest.fixture
def group(tmp_path: Path) -> Iterator[None]:
    with one_process_group(tmp_path / "store"):
        yield


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Path]:
    """The straight run's final weights, and a run stopped at 4 (snapshots 2 and 4)."""
    base = tmp_path_factory.mktemp("dcp_runs")
    with one_process_group(base / "store"):
        _, straight = train(base / "straight", autoload=False)
        train(base / "stopped", stop=4, autoload=False)
    return straight, base / "stopped"


def copy_of(runs: tuple[Any, Path], out: Path) -> Path:
    shutil.copytree(runs[1], out)
    return out


def assert_resumed_exactly(
    resumed: tuple[Any, dict[str, torch.Tensor]], straight: dict[str, torch.Tensor], path: Path
) -> None:
    snap, weights = resumed
    assert snap.loaded_from == str(path)
    for key, value in straight.items():
        assert torch.equal(weights[key], value), key


def _manifest(directory: Path) -> dict[str, Any]:
    return json.loads((directory / files.MANIFEST_NAME).read_text())  # type: ignore[no-any-return]


BAD_MANIFESTS: dict[str, Callable[[dict[str, Any]], str | None]] = {
    "bad JSON": lambda m: "{not json",
    "missing": lambda m: None,
    "a list": lambda m: json.dumps([m]),
    "iteration as a string": lambda m: json.dumps({**m, "iteration": str(m["iteration"])}),
    "an entry as a string": lambda m: json.dumps({**m, "files": {k: "ok" for k in m["files"]}}),
    "world_size missing": lambda m: json.dumps({k: v for k, v in m.items() if k != "world_size"}),
}


@pytest.mark.parametrize("damage", list(BAD_MANIFESTS))
def test_a_bad_manifest_is_skipped_with_a_warning_naming_the_snapshot_and_resume_goes_on(
    tmp_path: Path, group: None, runs: tuple[Any, Path], damage: str
) -> None:
    out = copy_of(runs, tmp_path / "run")
    newest = out / "snapshot_iter_4"
    written = BAD_MANIFESTS[damage](_manifest(newest))
    if written is None:
        (newest / files.MANIFEST_NAME).unlink()
    else:
        (newest / files.MANIFEST_NAME).write_text(written)
    with pytest.warns(
        SnapshotVerificationWarning, match=r"skipping snapshot .*snapshot_iter_4.*manifest"
    ):
        resumed = train(out)
    assert_resumed_exactly(resumed, runs[0], out / "snapshot_iter_2")


def test_a_stray_dotfile_inside_a_snapshot_is_ignored_and_the_snapshot_loads(
    tmp_path: Path, group: None, runs: tuple[Any, Path]
) -> None:
    out = copy_of(runs, tmp_path / "run")
    (out / "snapshot_iter_4" / ".DS_Store").write_bytes(b"\0\0\0\1Bud1")
    (out / "snapshot_iter_4" / "notes.txt").write_text("lr 0.1 looked fine\n")
    assert files.verify(str(out / "snapshot_iter_4"))["iteration"] == 4
    assert_resumed_exactly(train(out), runs[0], out / "snapshot_iter_4")


def _dead_pid() -> int:
    process = subprocess.Popen([sys.executable, "-c", ""])
    process.wait()
    return process.pid


@pytest.mark.skipif(sys.platform != "linux", reason="the leftover rule probes pids (POSIX)")
def test_an_unfinished_save_of_a_dead_run_is_removed_at_the_next_start_without_autoload(
    tmp_path: Path, group: None, runs: tuple[Any, Path]
) -> None:
    out = copy_of(runs, tmp_path / "run")
    # What a saver killed during the save of iteration 6 leaves: its shards, no manifest.
    dead = out / f".snapshot_iter_6.{_HOST_TAG}-{_dead_pid()}.dcp-tmp"
    shutil.copytree(out / "snapshot_iter_4", dead)
    (dead / files.MANIFEST_NAME).unlink()
    # A save in progress by a live process (this one), and one of another host: kept.
    live = out / f".snapshot_iter_6.{_HOST_TAG}-{os.getpid()}.dcp-tmp"
    other = "0" * 8 if _HOST_TAG != "0" * 8 else "1" * 8
    foreign = out / f".snapshot_iter_6.{other}-{_dead_pid()}.dcp-tmp"
    # A dead save of another series (snapshot_iter_{.iteration}_b): that series' run's to remove.
    another_series = out / f".snapshot_iter_6_b.{_HOST_TAG}-{_dead_pid()}.dcp-tmp"
    for kept in (live, foreign, another_series):
        kept.mkdir()
        (kept / "__0_0.distcp").write_bytes(b"partial")

    snap, _ = train(out, stop=1, autoload=False)

    assert snap.loaded_from is None
    assert not dead.exists()
    assert live.exists() and foreign.exists() and another_series.exists()


@pytest.mark.parametrize(
    ("net", "names"),
    [
        (
            {"outputs": 4},
            r"other shapes: fc\.bias \(saved \[2\], this run \[4\]\), "
            r"fc\.weight \(saved \[2, 3\], this run \[4, 3\]\)\.",
        ),
        ({"hidden": True}, r"missing from the snapshot: extra\.bias, extra\.weight"),
    ],
)
def test_a_snapshot_of_another_architecture_is_refused_naming_the_snapshot_and_keys(
    tmp_path: Path, group: None, runs: tuple[Any, Path], net: dict[str, Any], names: str
) -> None:
    out = copy_of(runs, tmp_path / "run")
    with pytest.raises(SnapshotError, match=r"snapshot_iter_4 holds other models") as raised:
        train(out, **net)
    assert raised.value.__class__ is SnapshotError
    assert "models['main']: " in str(raised.value)
    assert re.search(names, str(raised.value)), str(raised.value)


def test_a_smaller_model_than_the_snapshot_s_is_refused_not_loaded_in_part(
    tmp_path: Path, group: None
) -> None:
    out = tmp_path / "run"
    train(out, stop=2, autoload=False, hidden=True)
    with pytest.raises(SnapshotError, match=r"not in this run's model: extra\.bias, extra\.weight"):
        train(out)


@pytest.mark.slow
@pytest.mark.skipif(not _can_mount_tmpfs(), reason="needs unshare and a tmpfs mount")
@pytest.mark.parametrize("when", ["in DCP's background save", "filled: the rank file"])
def test_a_full_disk_is_a_disk_full_error_naming_the_snapshot_and_nothing_is_left(
    tmp_path: Path, when: str
) -> None:
    disk = tmp_path / "disk"
    disk.mkdir()
    command = (
        f"mount -t tmpfs -o size=1M tmpfs {disk} && "
        f"exec {sys.executable} {SCRIPTS / 'dcp_full_disk.py'} {disk} {tmp_path / 'store'} "
        + ("filled" if when.startswith("filled") else "")
    )
    result = subprocess.run(
        ["unshare", "--user", "--map-root-user", "--mount", "sh", "-c", command],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    lines = dict(line.split(": ", 1) for line in result.stdout.splitlines())
    assert lines["error"].startswith("DiskFullError: [Errno 28] no space left"), lines
    assert "'snapshot_iter_2'" in lines["error"] and str(disk / "snapshot_iter_2") in lines["error"]
    assert lines["leftovers"] == "[]"  # no temporary directory, nothing published
