"""A snapshot's series is the files whose whole name matches its template: retention and
autoload never touch another extension's files, a user's copy, or a file that does not load;
PPE's manifest-less snapshots are retired like ppe-core's, in iteration order; templates that
would fail at the first save (``snap_{}``, a name too long) are refused at setup; PPE's
private ``_find_*`` helpers follow the same rule (issues 42 items 4 and 13, 43 items 3-4)."""

from __future__ import annotations

import os
import shutil
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from ppe_extensions import _snapshot
from ppe_extensions._snapshot_retention import series_paths, series_pattern

import ppe_core as ppe
from ppe_core.errors import ConfigurationError

E = ppe.training.extensions
ITERS = 4  # per epoch


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(3, 1)

    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"loss": self.fc(x).square().mean()}


def _data() -> list[dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(0)
    return [{"x": torch.randn(2, 3, generator=g)} for _ in range(ITERS)]


def _trainer(out: Path, epochs: int, *extensions: Any, stop: Any = None) -> Any:
    torch.manual_seed(0)
    model = ppe.to(Net(), "cpu")
    trainer = ppe.engine.create_trainer(
        model,
        torch.optim.SGD(model.parameters(), lr=0.1),
        epochs,
        out_dir=str(out),
        stop_trigger=stop,
    )
    for extension in extensions:
        if isinstance(extension, tuple):
            trainer.extend(extension[0], trigger=extension[1])
        else:
            trainer.extend(extension)
    return trainer


def _names(out: Path) -> list[str]:
    return sorted(p.name for p in out.iterdir() if not p.name.startswith("."))


# ------------------------------------------------------------------------ the series rule


def test_series_pattern_matches_whole_names_only() -> None:
    pattern = series_pattern("snapshot_iter_{.iteration}")
    assert pattern.fullmatch("snapshot_iter_30")["iteration"] == "30"  # type: ignore[index]
    for other in ("snapshot_iter_30_model.pt", "snapshot_iter_30_good", "snapshot_iter_"):
        assert pattern.fullmatch(other) is None, other
    fancy = series_pattern("run-{.out}/e{.updater.epoch:03d}_i{0.iteration}.pt")
    match = fancy.fullmatch("run-x/e002_i8.pt")
    assert match is not None and (match["epoch"], match["iteration"]) == ("002", "8")
    assert fancy.fullmatch("run-x/y/e002_i8.pt") is None  # another field never spans a "/"


def test_snapshot_beside_snapshot_object_keeps_the_model_files_and_resumes_the_trainer(
    tmp_path: Path,
) -> None:
    def extensions(autoload: bool = True) -> list[Any]:
        model_file = "snapshot_iter_{.iteration}_model.pt"
        model = Net()  # a stand-in object: its own series, every 2 iterations
        return [
            E.snapshot(n_retains=1, autoload=autoload),
            (E.snapshot_object(model, model_file), (2, "iteration")),
        ]

    # Without autoload the first run's trainer snapshot keeps to its trigger (an autoloading
    # one would also save the end, iteration 10): the newest file is then a model-only one.
    first = _trainer(tmp_path, 3, *extensions(autoload=False), stop=(10, "iteration"))
    first.run(_data())
    assert _names(tmp_path) == sorted(
        ["snapshot_iter_8"] + [f"snapshot_iter_{i}_model.pt" for i in (2, 4, 6, 8, 10)]
    )
    # The newest file by iteration is a model-only one: autoload must not pick it.
    resumed = _trainer(tmp_path, 3, *extensions())
    resumed.run(_data())
    snap = resumed.manager.get_extension("_Snapshot")
    assert snap.loaded_from == str(tmp_path / "snapshot_iter_8")
    assert resumed.iteration == 12
    assert "snapshot_iter_12" in _names(tmp_path) and "snapshot_iter_8" not in _names(tmp_path)
    assert "snapshot_iter_2_model.pt" in _names(tmp_path)


def test_a_users_copy_is_never_deleted_nor_autoloaded(tmp_path: Path) -> None:
    _trainer(tmp_path, 1, E.snapshot()).run(_data())
    good = tmp_path / "snapshot_iter_4_good"
    shutil.copy(tmp_path / "snapshot_iter_4", good)
    os.utime(good, (4e9, 4e9))  # newest of all by time, and the same iteration inside
    resumed = _trainer(tmp_path, 3, E.snapshot(n_retains=1, autoload=True))
    resumed.run(_data())
    assert resumed.manager.get_extension("_Snapshot").loaded_from == str(
        tmp_path / "snapshot_iter_4"
    )
    assert _names(tmp_path) == ["snapshot_iter_12", "snapshot_iter_4_good"]


def _ppe() -> types.ModuleType:
    import pytorch_pfn_extras

    return pytorch_pfn_extras


def _ppe_snapshots(out: Path, epochs: int) -> None:
    """PPE 0.9 writes its snapshots (no manifests) of a manual training loop."""
    lib = _ppe()
    torch.manual_seed(0)
    model = Net()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    manager = lib.training.ExtensionsManager(
        model, optimizer, epochs, iters_per_epoch=ITERS, out_dir=str(out),
        extensions=[lib.training.extensions.snapshot()],
    )  # fmt: skip
    for batch in _data() * epochs:
        with manager.run_iteration():
            model(**batch)["loss"].backward()


@pytest.mark.parametrize(
    ("n_retains", "kept"),
    [(1, ["snapshot_iter_12"]), (2, ["snapshot_iter_12", "snapshot_iter_8"])],
)
def test_ppe_s_snapshots_are_retired_in_iteration_order_and_a_non_snapshot_stays(
    tmp_path: Path, n_retains: int, kept: list[str]
) -> None:
    _ppe_snapshots(tmp_path, 2)  # snapshot_iter_4 and snapshot_iter_8
    os.utime(tmp_path / "snapshot_iter_4", (4e9, 4e9))  # the older one touched last
    (tmp_path / "snapshot_iter_3").write_text("my notes, not a snapshot")
    resumed = _trainer(tmp_path, 3, E.snapshot(n_retains=n_retains, autoload=True))
    resumed.run(_data())  # snapshot_iter_3 (older by its name) is never tried
    assert resumed.manager.get_extension("_Snapshot").loaded_from == str(
        tmp_path / "snapshot_iter_8"
    )
    # PPE's snapshot_iter_4 is retired (the oldest by iteration, though the newest by time);
    # the text file does not load as a snapshot: never deleted.
    assert _names(tmp_path) == sorted([*kept, "snapshot_iter_3"])


def test_a_callable_filename_retires_only_this_run_s_files(tmp_path: Path) -> None:
    """Unchanged from before the series rule (a guard, not a fix): a callable names no series."""
    old = tmp_path / "snap_2"
    _trainer(tmp_path, 1, E.snapshot(filename="snap_{.iteration}")).run(_data())
    os.rename(tmp_path / "snap_4", old)
    os.rename(tmp_path / ".snap_4.manifest.json", tmp_path / ".snap_2.manifest.json")
    named = E.snapshot(filename=lambda m: f"snap_{m.iteration}", n_retains=1)
    trainer = _trainer(tmp_path, 3, named)
    trainer.run(_data())
    assert _names(tmp_path) == ["snap_12", "snap_2"]


# ------------------------------------------------------------------------ DCP directories


@pytest.fixture
def group(tmp_path: Path) -> Iterator[None]:
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/store", world_size=1, rank=0)
    try:
        yield
    finally:
        dist.destroy_process_group()


@pytest.mark.usefixtures("group")
def test_a_copied_dcp_directory_is_never_deleted_nor_autoloaded(tmp_path: Path) -> None:
    out = tmp_path / "out"

    def dcp(**kwargs: Any) -> Any:
        return E.snapshot(saver_rank=0, snapshot_mode=E.SnapshotMode.DCP, **kwargs)

    _trainer(out, 1, dcp()).run(_data())
    shutil.copytree(out / "snapshot_iter_4", out / "snapshot_iter_4_good")
    assert series_paths(str(out), "snapshot_iter_{.iteration}") == [str(out / "snapshot_iter_4")]
    resumed = _trainer(out, 3, dcp(n_retains=1, autoload=True))
    resumed.run(_data())
    assert resumed.manager.get_extension("_DCPSnapshot").loaded_from == str(out / "snapshot_iter_4")
    assert _names(out) == ["snapshot_iter_12", "snapshot_iter_4_good"]


# ------------------------------------------------------------------- refused at setup


def test_a_bare_field_template_is_refused_at_setup(tmp_path: Path) -> None:
    trainer = _trainer(tmp_path, 1, E.snapshot(filename="snap_{}"))
    with pytest.raises(ConfigurationError, match=r"\{\}.*manager itself.*\{\.iteration\}"):
        trainer.run(_data())
    assert not list(tmp_path.glob("snap_*"))


def test_a_name_too_long_for_the_file_system_is_refused_at_setup(tmp_path: Path) -> None:
    limit = os.pathconf(tmp_path, "PC_NAME_MAX")
    trainer = _trainer(tmp_path, 1, E.snapshot(filename="s" * 300 + "_{.iteration}"))
    with pytest.raises(ConfigurationError, match=rf"allows {limit} bytes a name.*shorten"):
        trainer.run(_data())
    assert trainer.iteration == 0
    # Just short enough at a large iteration (13 digits), with the manifest's temporary name.
    fits = "s" * (limit - 47 - 14) + "_{.iteration}"
    _trainer(tmp_path, 1, E.snapshot(filename=fits)).run(_data())
    assert len(list(tmp_path.glob("s*_4"))) == 1


# ------------------------------------------------------------------- PPE's private helpers


def test_find_helpers_keep_ppe_s_signatures_and_follow_the_series(tmp_path: Path) -> None:
    import inspect

    from pytorch_pfn_extras.training.extensions import _snapshot as ppe_snapshot

    for name in ("_find_snapshot_files", "_find_latest_snapshot", "_find_stale_snapshots"):
        ours = list(inspect.signature(getattr(_snapshot, name)).parameters)
        assert ours == list(inspect.signature(getattr(ppe_snapshot, name)).parameters), name
    for i, name in enumerate(["snapshot_iter_4", "snapshot_iter_8", "snapshot_iter_12"]):
        (tmp_path / name).write_bytes(b"x")
        os.utime(tmp_path / name, (1e9 + i, 1e9 + i))
    fmt, fs = "snapshot_iter_{.iteration}", _ppe().writing.SimpleWriter().fs
    # As PPE's on a plain series, with PPE's file system object or ppe-core's default.
    for ours_fs in (fs, None):
        assert _snapshot._find_snapshot_files(fmt, str(tmp_path), ours_fs) == (
            ppe_snapshot._find_snapshot_files(fmt, str(tmp_path), fs)
        )
        assert _snapshot._find_latest_snapshot(fmt, str(tmp_path), ours_fs) == "snapshot_iter_12"
        stale = list(_snapshot._find_stale_snapshots(fmt, str(tmp_path), 2, ours_fs))
        assert stale == list(ppe_snapshot._find_stale_snapshots(fmt, str(tmp_path), 2, fs))
    # Stricter: a user's copy and another series are not snapshots of this one, and the
    # iteration in the name orders files, not the time they were touched.
    (tmp_path / "snapshot_iter_12_good").write_bytes(b"x")
    (tmp_path / "snapshot_iter_12_model.pt").write_bytes(b"x")
    os.utime(tmp_path / "snapshot_iter_4", (2e9, 2e9))
    assert ppe_snapshot._find_latest_snapshot(fmt, str(tmp_path), fs) != "snapshot_iter_12"
    assert _snapshot._find_latest_snapshot(fmt, str(tmp_path), fs) == "snapshot_iter_12"
    assert list(_snapshot._find_stale_snapshots(fmt, str(tmp_path), 1, None)) == [
        "snapshot_iter_4",
        "snapshot_iter_8",
    ]


class _RunsCode:
    """Unpickling this would create ``marker``: a stand-in for code execution."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, tuple[str, str]]:
        return (open, (str(self.marker), "w"))


def test_a_planted_file_outside_the_series_is_never_opened(tmp_path: Path) -> None:
    _trainer(tmp_path, 1, E.snapshot()).run(_data())
    torch.save({"_start_iteration": 99, "x": _RunsCode(tmp_path / "marker")}, tmp_path / "p")
    os.rename(tmp_path / "p", tmp_path / "snapshot_iter_payload")  # not a run of digits
    resumed = _trainer(tmp_path, 2, E.snapshot(autoload=True, n_retains=1))
    resumed.run(_data())
    assert resumed.manager.get_extension("_Snapshot").loaded_from == str(
        tmp_path / "snapshot_iter_4"
    )
    assert not (tmp_path / "marker").exists()
    assert _names(tmp_path) == ["snapshot_iter_8", "snapshot_iter_payload"]
