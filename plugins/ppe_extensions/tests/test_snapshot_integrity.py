"""Snapshot integrity when things go wrong: unreadable manifests, stray files in the output
directory, states that must load back, ordering by iteration and links out of the directory."""

from __future__ import annotations

import collections
import datetime
import enum
import json
import os
import pathlib
import pickle
import random
import re
import shutil
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from ppe_extensions._snapshot import load_snapshot, manifest_path, verify_snapshot

import ppe_core as ppe
from ppe_core.errors import (
    SnapshotError,
    SnapshotStateError,
    SnapshotVerificationWarning,
    UnsafeSnapshotError,
)

E = ppe.training.extensions


class Net(torch.nn.Module):
    def __init__(self, features: int = 4) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(features, 2)

    def forward(self, x: torch.Tensor, t: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"loss": torch.nn.functional.cross_entropy(self.fc(x), t)}


def loader() -> torch.utils.data.DataLoader[Any]:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(40, 4, generator=g)
    data = [{"x": x[i], "t": (x[i, 0] > 0).long()} for i in range(40)]
    return torch.utils.data.DataLoader(data, batch_size=4, shuffle=True)  # type: ignore[arg-type]


def make_trainer(out: Path, epochs: int, *extensions: Any, stop: Any = None) -> Any:
    torch.manual_seed(0)
    model = ppe.to(Net(), "cpu")
    return ppe.engine.create_trainer(
        model,
        torch.optim.Adam(model.parameters(), lr=0.01),
        epochs,
        out_dir=str(out),
        extensions=list(extensions),
        stop_trigger=stop,
    )


def weights(trainer: Any) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in trainer.models["main"].state_dict().items()}


def loaded_from(trainer: Any) -> str | None:
    return trainer.manager.get_extension("_Snapshot").loaded_from  # type: ignore[no-any-return]


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, torch.Tensor], Path]:
    """The weights of an uninterrupted 3-epoch run, and a directory holding two_epochs()."""
    base = tmp_path_factory.mktemp("runs")
    reference = make_trainer(base / "ref", 3)
    reference.run(loader())
    two_epochs(base / "two_epochs")
    return weights(reference), base / "two_epochs"


def copy_of(runs: tuple[dict[str, torch.Tensor], Path], out: Path) -> Path:
    shutil.copytree(runs[1], out)
    return out


def two_epochs(out: Path, **kwargs: Any) -> None:
    """Snapshots snapshot_iter_10 and snapshot_iter_20 of a 3-epoch run stopped after 2."""
    make_trainer(out, 3, E.snapshot(**kwargs), stop=(2, "epoch")).run(loader())


def flip_weight_bytes(path: Path) -> None:
    """Negate fc.weight inside the archive: a valid torch file holding other weights."""
    data = bytearray(path.read_bytes())
    weight = load_snapshot(str(path))["models"]["main"]["fc.weight"]
    raw = weight.numpy().tobytes()
    at = bytes(data).index(raw)
    data[at : at + len(raw)] = (-weight).numpy().tobytes()
    path.write_bytes(bytes(data))


# Item 6: an unreadable manifest is a failed check -------------------------------------------
def _good_manifest(path: Path) -> dict[str, Any]:
    return json.loads(Path(manifest_path(str(path))).read_text())  # type: ignore[no-any-return]


BAD_MANIFESTS = {
    "bad JSON": lambda m: "{this is not json",
    "truncated": lambda m: json.dumps(m)[:40],
    "another schema": lambda m: json.dumps({"files": ["snapshot_iter_20"], "sha": m["sha256"]}),
    "a list": lambda m: json.dumps([m]),
    "size as a string": lambda m: json.dumps({**m, "size": str(m["size"])}),
    "sha256 missing": lambda m: json.dumps({k: v for k, v in m.items() if k != "sha256"}),
    "iteration as a float": lambda m: json.dumps({**m, "iteration": 20.5}),
}


@pytest.mark.parametrize("damage", list(BAD_MANIFESTS))
def test_unreadable_manifest_skips_the_snapshot_and_never_loads_damaged_weights(
    tmp_path: Path, damage: str, runs: tuple[dict[str, torch.Tensor], Path]
) -> None:
    out = copy_of(runs, tmp_path / "run")
    newest = out / "snapshot_iter_20"
    manifest = _good_manifest(newest)
    flip_weight_bytes(newest)
    Path(manifest_path(str(newest))).write_text(BAD_MANIFESTS[damage](manifest))
    with pytest.raises(SnapshotError, match="unreadable manifest"):
        verify_snapshot(str(newest))

    resumed = make_trainer(out, 3, E.snapshot(autoload=True))
    with pytest.warns(SnapshotVerificationWarning, match=r"snapshot_iter_20.*unreadable manifest"):
        resumed.run(loader())
    assert loaded_from(resumed) == str(out / "snapshot_iter_10")
    for key, value in runs[0].items():  # bit-exact from the previous snapshot
        assert torch.equal(value, weights(resumed)[key])


# Item 7: files named like snapshots that are not snapshots -----------------------------------
def _zip_that_is_not_torch(path: Path) -> None:
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("notes/readme.txt", "not a torch archive")


STRAY_FILES = {
    "snapshot_iter_94": lambda p: p.write_text("lr 0.01 looked better\n"),
    "snapshot_iter_99": lambda p: p.write_bytes(random.Random(0).randbytes(5000)),
    "snapshot_iter_98": _zip_that_is_not_torch,
    "snapshot_iter_97": lambda p: torch.save([torch.ones(2), 3], p),
    "snapshot_iter_96": lambda p: p.write_bytes(pickle.dumps({"_start_iteration": 96})),
    "snapshot_iter_95": lambda p: p.write_bytes(b""),
}


def test_files_named_like_snapshots_are_skipped_and_resume_goes_on(
    tmp_path: Path, runs: tuple[dict[str, torch.Tensor], Path]
) -> None:
    out = copy_of(runs, tmp_path / "run")
    for name, write in STRAY_FILES.items():
        write(out / name)

    resumed = make_trainer(out, 3, E.snapshot(autoload=True))
    with pytest.warns(SnapshotVerificationWarning) as record:
        resumed.run(loader())
    named = {name for name in STRAY_FILES for w in record if name in str(w.message)}
    assert named == set(STRAY_FILES)
    assert all(issubclass(w.category, SnapshotVerificationWarning) for w in record)
    assert loaded_from(resumed) == str(out / "snapshot_iter_20")
    for key, value in runs[0].items():
        assert torch.equal(value, weights(resumed)[key])


class _RunsCode:
    """Unpickling this would run a shell command that creates ``marker``."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, tuple[str]]:
        return (os.system, (f"touch {self.marker}",))


@pytest.mark.parametrize(
    ("name", "how"),
    [
        ("snapshot_iter_99", "torch.save"),
        ("snapshot_iter_99", "pickle"),
    ],
)
def test_a_pickle_that_would_run_code_is_refused_named_and_never_runs(
    tmp_path: Path, name: str, how: str, runs: tuple[dict[str, torch.Tensor], Path]
) -> None:
    tmp_path = copy_of(runs, tmp_path / "run")
    marker = tmp_path / "marker"
    planted = tmp_path / name
    payload = {"_start_iteration": 99, "x": _RunsCode(marker)}
    if how == "pickle":
        planted.write_bytes(pickle.dumps(payload))
    else:
        torch.save(payload, planted)
    resumed = make_trainer(tmp_path, 3, E.snapshot(autoload=True))
    with pytest.raises(UnsafeSnapshotError, match=f"{name}.*system") as info:
        resumed.run(loader())
    assert "could run code" in str(info.value)
    assert not marker.exists()


def test_a_snapshot_of_another_model_stops_resume_with_a_clear_error(
    tmp_path: Path, runs: tuple[dict[str, torch.Tensor], Path]
) -> None:
    """A valid snapshot of another model is not skipped: resuming from an older file, or
    starting afresh over the directory, would hide that out_dir belongs to another run."""
    tmp_path = copy_of(runs, tmp_path / "run")
    torch.manual_seed(0)
    model = ppe.to(Net(features=3), "cpu")
    other = ppe.engine.create_trainer(
        model,
        torch.optim.Adam(model.parameters()),
        3,
        out_dir=str(tmp_path),
        extensions=[E.snapshot(autoload=True)],
    )
    with pytest.raises(SnapshotError, match=r"(?s)snapshot_iter_20 failed.*size mismatch.*out_dir"):
        other.run(loader())


# Item 8: what saves must load ----------------------------------------------------------------
class Color(enum.Enum):
    RED = 1


class Keeper(ppe.training.Extension):
    """An extension whose state holds ``value``; remembers what it was given back."""

    trigger = (1, "epoch")

    def __init__(self, value: Any) -> None:
        self.value = value
        self.restored: dict[str, Any] | None = None

    def __call__(self, manager: Any) -> None:
        pass

    def state_dict(self) -> dict[str, Any]:
        return {"value": self.value, "nested": [{"value": self.value}]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.restored = state


def _equal(a: Any, b: Any) -> bool:
    if type(a) is not type(b):
        return False
    if isinstance(a, np.ndarray):
        return a.dtype == b.dtype and np.array_equal(a, b)
    if isinstance(a, tuple):
        return len(a) == len(b) and all(_equal(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, torch.Tensor):
        return torch.equal(a, b)
    if isinstance(a, collections.defaultdict) and a.default_factory is not b.default_factory:
        return False
    if isinstance(a, dict):
        return list(a) == list(b) and all(_equal(a[k], b[k]) for k in a)
    return bool(a == b)


def _values() -> dict[str, Any]:
    np.random.seed(3)
    return {
        "numpy array": np.arange(6, dtype=np.float32).reshape(2, 3),
        "numpy int array": np.array([1, 2], dtype=np.uint8),
        "numpy str array": np.array(["a", "bc"]),
        "numpy scalar float": np.float64(0.25),
        "numpy scalar int": np.int64(7),
        "numpy scalar bool": np.bool_(True),
        "np.random.get_state()": np.random.get_state(),
        "numpy Generator state": np.random.default_rng(1).bit_generator.state,
        "datetime": datetime.datetime(2026, 12, 3, 17, 30, 5, 123),
        "datetime with UTC": datetime.datetime(2026, 12, 3, tzinfo=datetime.timezone.utc),
        "date": datetime.date(2026, 12, 3),
        "timedelta": datetime.timedelta(hours=5, microseconds=3),
        "defaultdict(list)": collections.defaultdict(list, {"a": [1, 2]}),
        "defaultdict(int) of tensors": collections.defaultdict(int, {"t": torch.arange(3)}),
        "defaultdict without factory": collections.defaultdict(None, {"k": 1}),
        "pathlib.Path": Path("/data/run") / "x.txt",
        "PurePosixPath": pathlib.PurePosixPath("a/b"),
        "PureWindowsPath": pathlib.PureWindowsPath("C:/data/x"),
        "set": {1, 2, 3},
        "frozenset": frozenset({"a"}),
        "torch.Size and dtype": (torch.Size([2, 3]), torch.float16),
        "OrderedDict": collections.OrderedDict([("b", 1), ("a", 2)]),
        "bytes": b"\x00\xff",
    }


SCOPED_ALLOWLIST = pytest.mark.skipif(
    not hasattr(torch.serialization, "safe_globals"),
    reason="torch < 2.5 cannot scope an allow-list: these values are refused when saved",
)


@SCOPED_ALLOWLIST
@pytest.mark.parametrize("writer", ["SimpleWriter", "ThreadWriter"])
def test_extension_state_values_round_trip_through_the_safe_loader(
    tmp_path: Path, writer: str
) -> None:
    values = _values()
    make_trainer(
        tmp_path,
        3,
        Keeper(values),
        E.snapshot(writer=getattr(ppe.writing, writer)()),
        stop=(1, "epoch"),
    ).run(loader())
    resuming = Keeper(None)
    resumed = make_trainer(tmp_path, 1, resuming, E.snapshot(autoload=True))
    resumed.run(loader())
    assert loaded_from(resumed) == str(tmp_path / "snapshot_iter_10")
    assert resuming.restored is not None
    for kind, value in values.items():
        restored = resuming.restored["value"][kind]
        assert _equal(restored, value), (kind, restored, value)
        assert _equal(resuming.restored["nested"][0]["value"][kind], value), kind


@pytest.mark.parametrize(
    ("value", "kind", "where"),
    [
        (Color.RED, "Color", r"\['value'\]"),
        ([Color.RED], "Color", r"\['value'\]\[0\]"),
        ({"when": {1: Color.RED}}, "Color", r"\['value'\]\['when'\]\[1\]"),
        (collections.defaultdict(lambda: 0), "function", r"\['value'\]\['default_factory'\]"),
        (object(), "builtins.object", r"\['value'\]"),
    ],
)
def test_a_value_the_safe_loader_would_refuse_stops_training_when_saved(
    tmp_path: Path, value: Any, kind: str, where: str
) -> None:
    trainer = make_trainer(tmp_path, 2, Keeper(value), E.snapshot())
    with pytest.raises(SnapshotStateError, match=rf"extension 'Keeper' \(at {where}.*{kind}"):
        trainer.run(loader())
    assert trainer.iteration == 10  # at the first snapshot, not at a resume after a crash
    assert not (tmp_path / "snapshot_iter_10").exists()


@SCOPED_ALLOWLIST
def test_an_allow_listed_class_is_accepted(tmp_path: Path) -> None:
    with torch.serialization.safe_globals([Color]):
        make_trainer(tmp_path, 2, Keeper(Color.RED), E.snapshot(), stop=(1, "epoch")).run(loader())
        resuming = Keeper(None)
        make_trainer(tmp_path, 1, resuming, E.snapshot(autoload=True)).run(loader())
    assert resuming.restored is not None and resuming.restored["value"] is Color.RED


# Item 11: ordering by iteration; links out of the directory ---------------------------------
def test_newest_is_chosen_by_iteration_not_by_a_manifest_dated_in_the_future(
    tmp_path: Path, runs: tuple[dict[str, torch.Tensor], Path]
) -> None:
    tmp_path = copy_of(runs, tmp_path / "run")
    older = tmp_path / "snapshot_iter_10"
    manifest = _good_manifest(older)
    manifest["created"] += 10 * 365 * 86400  # a clock ten years ahead
    Path(manifest_path(str(older))).write_text(json.dumps(manifest))
    os.utime(older, (manifest["created"], manifest["created"]))
    resumed = make_trainer(tmp_path, 3, E.snapshot(autoload=True))
    resumed.run(loader())
    assert loaded_from(resumed) == str(tmp_path / "snapshot_iter_20")


def test_without_manifests_the_name_then_the_state_tells_the_iteration(tmp_path: Path) -> None:
    for template, newest in [
        ("snapshot_iter_{.iteration}", "snapshot_iter_20"),
        ("snap_epoch_{.epoch}", "snap_epoch_2"),
    ]:
        out = tmp_path / template.split("_")[1]
        two_epochs(out, filename=template)
        for path in out.iterdir():
            if path.name.startswith("."):
                path.unlink()  # as PPE writes them: no manifests
        os.utime(out / newest, (1_000_000, 1_000_000))  # an mtime older than the others
        resumed = make_trainer(out, 3, E.snapshot(filename=template, autoload=True))
        resumed.run(loader())
        assert loaded_from(resumed) == str(out / newest), template
        assert resumed.iteration == 30


def test_a_link_to_a_snapshot_outside_the_directory_is_not_loaded(
    tmp_path: Path, runs: tuple[dict[str, torch.Tensor], Path]
) -> None:
    out = copy_of(runs, tmp_path / "run")
    elsewhere = tmp_path / "other_run"
    elsewhere.mkdir()
    target = elsewhere / "snapshot_iter_50"
    shutil.copy(out / "snapshot_iter_10", target)  # a file this run did not write there
    (out / "snapshot_iter_50").symlink_to(target)
    (out / "latest").symlink_to(out / "snapshot_iter_20")  # inside: fine, but not a match
    resumed = make_trainer(out, 3, E.snapshot(autoload=True))
    with pytest.warns(SnapshotVerificationWarning, match=f"link to {re.escape(str(target))} "):
        resumed.run(loader())
    assert loaded_from(resumed) == str(out / "snapshot_iter_20")


def test_a_link_inside_the_directory_is_loaded(tmp_path: Path) -> None:
    out = tmp_path / "run"
    two_epochs(out, filename="archive_{.iteration}")
    (out / "snapshot_iter_20").symlink_to(out / "archive_20")
    resumed = make_trainer(out, 3, E.snapshot(autoload=True))
    resumed.run(loader())
    assert loaded_from(resumed) == str(out / "snapshot_iter_20")
