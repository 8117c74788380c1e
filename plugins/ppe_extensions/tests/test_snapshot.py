"""Snapshots: verified files, n_retains, autoload with fallback, safe loading, round trips."""

from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from ppe_extensions._snapshot import (
    MANIFEST_SUFFIX,
    load_snapshot,
    manifest_path,
    verify_snapshot,
)

import ppe_core as ppe
from ppe_core.errors import SnapshotError, SnapshotVerificationWarning, UnsafeSnapshotError

E = ppe.training.extensions


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(4, 2)
        self.drop = torch.nn.Dropout(0.2)

    def forward(self, x: torch.Tensor, t: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"loss": torch.nn.functional.cross_entropy(self.drop(self.fc(x)), t)}


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


def snapshots(out: Path) -> list[str]:
    return sorted(
        p.name for p in out.iterdir() if p.name.startswith("snap") and MANIFEST_SUFFIX not in p.name
    )


def test_default_snapshot_once_per_epoch_with_manifest(tmp_path: Path) -> None:
    trainer = make_trainer(tmp_path, 3, E.snapshot())
    trainer.run(loader())
    assert snapshots(tmp_path) == ["snapshot_iter_10", "snapshot_iter_20", "snapshot_iter_30"]
    manifest = verify_snapshot(str(tmp_path / "snapshot_iter_30"))
    assert manifest["iteration"] == 30
    data = (tmp_path / "snapshot_iter_30").read_bytes()
    assert manifest["sha256"] == hashlib.sha256(data).hexdigest()
    state = load_snapshot(str(tmp_path / "snapshot_iter_30"))  # weights_only=True inside
    assert state["_start_iteration"] == 30
    assert set(state["models"]) == {"main"}
    assert not [p for p in os.listdir(tmp_path) if p.endswith(".tmp")]


def test_snapshot_runs_after_the_other_extensions_of_its_iteration(tmp_path: Path) -> None:
    log = E.LogReport()
    trainer = make_trainer(tmp_path, 2, E.snapshot(), log)
    trainer.run(loader())
    state = load_snapshot(str(tmp_path / "snapshot_iter_20"))
    saved_log = json.loads(state["extensions"]["LogReport"]["extension"]["_log"])
    assert [e["iteration"] for e in saved_log] == [10, 20]  # LogReport ran first


def test_n_retains_keeps_the_newest_complete_snapshots(tmp_path: Path) -> None:
    trainer = make_trainer(tmp_path, 4, E.snapshot(n_retains=2))
    trainer.run(loader())
    assert snapshots(tmp_path) == ["snapshot_iter_30", "snapshot_iter_40"]
    assert sorted(p for p in os.listdir(tmp_path) if p.endswith(MANIFEST_SUFFIX)) == [
        ".snapshot_iter_30" + MANIFEST_SUFFIX,
        ".snapshot_iter_40" + MANIFEST_SUFFIX,
    ]


def test_autoload_resumes_to_the_same_weights(tmp_path: Path) -> None:
    reference = make_trainer(tmp_path / "ref", 3)
    reference.run(loader())

    out = tmp_path / "run"
    first = make_trainer(out, 3, E.snapshot(autoload=True), stop=(2, "epoch"))
    first.run(loader())
    second = make_trainer(out, 3, E.snapshot(autoload=True))
    second.run(loader())
    assert second.iteration == 30
    for key, value in weights(reference).items():
        assert torch.equal(value, weights(second)[key])


def test_truncated_newest_snapshot_is_skipped_with_warning_and_falls_back(
    tmp_path: Path,
) -> None:
    reference = make_trainer(tmp_path / "ref", 4)
    reference.run(loader())

    out = tmp_path / "run"
    ext = ppe.training.ExtensionEntry(E.snapshot(autoload=True), trigger=(7, "iteration"))
    make_trainer(out, 4, ext, stop=(30, "iteration")).run(loader())
    newest = out / "snapshot_iter_30"  # the end of training, saved too (after 7, ..., 28)
    newest.write_bytes(newest.read_bytes()[:100])  # a torn write under the final name
    ext = ppe.training.ExtensionEntry(E.snapshot(autoload=True), trigger=(7, "iteration"))
    resumed = make_trainer(out, 4, ext)
    with pytest.warns(SnapshotVerificationWarning, match="snapshot_iter_30.*truncated"):
        resumed.run(loader())
    assert resumed.manager.get_extension("_Snapshot").loaded_from == str(out / "snapshot_iter_28")
    for key, value in weights(reference).items():
        assert torch.equal(value, weights(resumed)[key])


def test_snapshot_without_manifest_is_loaded_unverified(tmp_path: Path) -> None:
    trainer = make_trainer(tmp_path, 3, E.snapshot(), stop=(2, "epoch"))
    trainer.run(loader())
    # Killed between the two writes: the data file is complete (renamed into place).
    os.remove(manifest_path(str(tmp_path / "snapshot_iter_20")))
    with pytest.raises(SnapshotError, match="no manifest"):
        verify_snapshot(str(tmp_path / "snapshot_iter_20"))
    again = make_trainer(tmp_path, 3, E.snapshot(autoload=True))
    again.run(loader())
    loaded = again.manager.get_extension("_Snapshot").loaded_from
    assert loaded == str(tmp_path / "snapshot_iter_20")
    assert snapshots(tmp_path) == ["snapshot_iter_10", "snapshot_iter_20", "snapshot_iter_30"]


def test_torn_snapshot_without_manifest_is_skipped(tmp_path: Path) -> None:
    trainer = make_trainer(tmp_path, 3, E.snapshot(), stop=(2, "epoch"))
    trainer.run(loader())
    newest = tmp_path / "snapshot_iter_20"
    os.remove(manifest_path(str(tmp_path / "snapshot_iter_20")))
    newest.write_bytes(newest.read_bytes()[:200])  # torn, as a non-atomic writer leaves it
    again = make_trainer(tmp_path, 3, E.snapshot(autoload=True))
    with pytest.warns(SnapshotVerificationWarning, match="snapshot_iter_20.*without a manifest"):
        again.run(loader())
    loaded = again.manager.get_extension("_Snapshot").loaded_from
    assert loaded == str(tmp_path / "snapshot_iter_10")


class _CreatesAFile:
    """Unpickling this would create a file: a stand-in for code execution."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self) -> tuple[Any, tuple[str, str]]:
        return (open, (self.path, "w"))


def test_planted_pickle_is_refused_and_never_executed(tmp_path: Path) -> None:
    trainer = make_trainer(tmp_path, 1, E.snapshot())
    trainer.run(loader())
    evidence = tmp_path / "pwned"
    planted = tmp_path / "snapshot_iter_99"
    torch.save({"_start_iteration": 99, "payload": _CreatesAFile(str(evidence))}, planted)
    data = planted.read_bytes()
    manifest = {
        "format": "ppe-core-snapshot",
        "version": 1,
        "sha256": hashlib.sha256(data).hexdigest(),
        "size": len(data),
        "iteration": 99,
        "created": time.time(),
    }
    Path(manifest_path(str(planted))).write_text(json.dumps(manifest))
    resumed = make_trainer(tmp_path, 2, E.snapshot(autoload=True))
    with pytest.raises(UnsafeSnapshotError, match="snapshot_iter_99") as info:
        resumed.run(loader())
    assert "could run code" in str(info.value)
    assert not evidence.exists()


def test_snapshot_object_condition_and_on_error(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = ppe.to(Net(), "cpu")
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    allow = iter([False, True])

    class Boom(ppe.training.Extension):
        trigger = (15, "iteration")

        def __call__(self, manager: Any) -> None:
            raise RuntimeError("extension failed")

    trainer = ppe.engine.create_trainer(
        model,
        optimizer,
        3,
        out_dir=str(tmp_path),
        extensions=[
            E.snapshot_object(model, "model_{.epoch}", condition=lambda: next(allow)),
            E.snapshot(filename="on_error", snapshot_on_error=True, condition=lambda: False),
            Boom(),
        ],
    )
    with pytest.raises(RuntimeError, match="extension failed"):
        trainer.run(loader())
    assert (tmp_path / "model_1").exists() is False  # condition was False at epoch 1
    # Epoch 2 never completed: the error came at iteration 15; the error snapshot exists, in
    # its own directory (autoload never resumes from it).
    saved = load_snapshot(str(tmp_path / "snapshots_on_error" / "on_error"))
    assert saved["_start_iteration"] == 15
    assert not (tmp_path / "model_2").exists()


def test_snapshot_object_saves_a_loadable_model_state(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = ppe.to(Net(), "cpu")
    trainer = ppe.engine.create_trainer(
        model,
        torch.optim.SGD(model.parameters(), lr=0.1),
        1,
        out_dir=str(tmp_path),
        extensions=[E.snapshot_object(model, "model_iter_{.iteration}")],
    )
    trainer.run(loader())
    fresh = Net()
    fresh.load_state_dict(load_snapshot(str(tmp_path / "model_iter_10")))
    for a, b in zip(fresh.parameters(), model.parameters(), strict=True):
        assert torch.equal(a, b)


def test_bad_snapshot_arguments_are_rejected() -> None:
    with pytest.raises(TypeError, match="n_retains"):
        E.snapshot(n_retains="2")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="filename"):
        E.snapshot(filename="")
    with pytest.raises(TypeError, match="together"):
        E.snapshot(savefun=torch.save, writer=ppe.writing.SimpleWriter())
    with pytest.raises(ValueError, match="callable filename"):
        E.snapshot(filename=lambda m: "x", autoload=True)


def test_every_standard_extension_survives_a_snapshot_round_trip(tmp_path: Path) -> None:
    import io

    def extensions() -> list[Any]:
        torch.manual_seed(0)
        return [
            E.LogReport(),
            E.PrintReport(["epoch", "train/loss"], out=io.StringIO()),
            E.ProgressBar(out=io.StringIO()),
            E.MinValue("train/loss"),
            E.MicroAverage("train/loss", "train/loss", "train/ratio"),
            E.ParameterStatistics(torch.nn.Linear(1, 1)),
            E.observe_value("constant", lambda manager: 1.0),
        ]

    def build(out: Path, epochs: int, stop: Any = None) -> Any:
        torch.manual_seed(0)
        model = ppe.to(Net(), "cpu")
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        scheduler = torch.optim.lr_scheduler.StepLR(optimizer, 1, gamma=0.5)
        return ppe.engine.create_trainer(
            model,
            optimizer,
            epochs,
            out_dir=str(out),
            stop_trigger=stop,
            extensions=[
                *extensions(),
                E.LRScheduler(scheduler),
                E.observe_lr(optimizer),
                E.snapshot(autoload=True),
            ],
        )

    reference = build(tmp_path / "ref", 3)
    reference.run(loader())
    build(tmp_path / "run", 3, stop=(2, "epoch")).run(loader())
    resumed = build(tmp_path / "run", 3)
    resumed.run(loader())
    ref_log = reference.manager.get_extension("LogReport").log
    log = resumed.manager.get_extension("LogReport").log
    assert [e["iteration"] for e in log] == [10, 20, 30]
    for a, b in zip(ref_log, log, strict=True):
        for key in ("train/loss", "lr", "constant", "train/ratio"):
            assert a[key] == b[key], key
    assert resumed.optimizers["main"].param_groups[0]["lr"] == pytest.approx(0.1 * 0.5**3)
    best = resumed.manager.get_extension("min_value")
    assert best.best_value == reference.manager.get_extension("min_value").best_value


def test_failing_extension_keeps_the_written_log_and_reraises(tmp_path: Path) -> None:
    errors: list[str] = []

    class Boom(ppe.training.Extension):
        trigger = (25, "iteration")

        def __call__(self, manager: Any) -> None:
            raise ValueError("boom at 25")

        def on_error(self, manager: Any, exc: BaseException, tb: Any) -> None:
            errors.append(f"Boom saw {exc}")

    class Witness(ppe.training.Extension):
        def __call__(self, manager: Any) -> None:
            pass

        def on_error(self, manager: Any, exc: BaseException, tb: Any) -> None:
            errors.append(f"Witness saw {exc}")

    trainer = make_trainer(tmp_path, 5, E.LogReport(), Boom(), Witness())
    with pytest.raises(ValueError, match="boom at 25") as info:
        trainer.run(loader())
    assert type(info.value) is ValueError  # the original error, unchanged
    assert sorted(errors) == ["Boom saw boom at 25", "Witness saw boom at 25"]
    log = json.loads((tmp_path / "log").read_text())
    assert [e["iteration"] for e in log] == [10, 20]


def test_state_from_an_earlier_ppe_core_layout_still_resumes(tmp_path: Path) -> None:
    reference = make_trainer(tmp_path / "ref", 2)
    reference.run(loader())
    first = make_trainer(tmp_path / "run", 2, stop=(15, "iteration"))
    first.run(loader())
    state = first.state_dict()
    # Earlier ppe-core versions kept the trainer state among the extensions.
    trainer_state = state.pop("_ppe_core")["trainer_state"]
    state["extensions"]["_trainer_state"] = {"extension": trainer_state, "trigger": {}}
    resumed = make_trainer(tmp_path / "run", 2)
    resumed.load_state_dict(state)
    resumed.run(loader())
    for key, value in weights(reference).items():
        assert torch.equal(value, weights(resumed)[key])  # bit-exact: the RNG states were found


# Background writers: training pauses only for a host copy --------------------------------
@pytest.mark.parametrize("writer_class", ["ThreadWriter", "ThreadQueueWriter", "ProcessWriter"])
def test_background_writer_snapshots_equal_the_synchronous_ones(
    tmp_path: Path, writer_class: str
) -> None:
    sync = make_trainer(tmp_path / "sync", 2, E.snapshot(filename="snap_{.iteration}"))
    sync.run(loader())
    writer = getattr(ppe.writing, writer_class)()
    background = make_trainer(
        tmp_path / "bg", 2, E.snapshot(filename="snap_{.iteration}", writer=writer)
    )
    background.run(loader())
    for iteration in (10, 20):
        name = f"snap_{iteration}"
        verify_snapshot(str(tmp_path / "bg" / name))  # complete, hash matches the bytes
        expected = load_snapshot(str(tmp_path / "sync" / name))["models"]["main"]
        saved = load_snapshot(str(tmp_path / "bg" / name))["models"]["main"]
        # Taken at its own iteration although training went on while it was written.
        for key, value in expected.items():
            assert torch.equal(saved[key], value), (iteration, key)


def test_background_snapshot_is_a_copy_taken_when_it_fired(tmp_path: Path) -> None:
    from ppe_extensions._snapshot_base import host_copy

    model = torch.nn.BatchNorm1d(3)
    state = {"models": {"main": model.state_dict()}, "n": 1, "pair": (torch.ones(1), [2])}
    copied = host_copy(state)
    with torch.no_grad():
        model.weight.add_(1.0)
    assert torch.equal(copied["models"]["main"]["weight"], torch.ones(3))
    # The module state_dict's version metadata survives (load_state_dict reads it).
    assert copied["models"]["main"]._metadata == state["models"]["main"]._metadata
    assert copied["pair"][1] == [2] and copied["pair"][1] is not state["pair"][1]


def test_failed_background_snapshot_is_reported_and_leaves_no_manifest(tmp_path: Path) -> None:
    blocker = tmp_path / "not_a_directory"

    def block(manager: Any) -> None:
        # After setup (which would name a file given as out_dir), so the save itself fails.
        if blocker.is_dir():
            blocker.rmdir()
            blocker.write_text("a file where the writer's directory should be")

    # The save runs, and fails, in the snapshot's background thread.
    writer = ppe.writing.ThreadWriter(out_dir=str(blocker))
    trainer = make_trainer(
        tmp_path,
        2,
        E.snapshot(filename="snap_{.iteration}", writer=writer),
        ppe.training.ExtensionEntry(block, trigger=(1, "iteration")),
    )
    with pytest.raises(SnapshotError, match="background snapshot save failed"):
        trainer.run(loader())
    assert not list(tmp_path.rglob("*" + MANIFEST_SUFFIX))
