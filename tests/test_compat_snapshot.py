"""Snapshots move between PPE 0.9 and ppe-core in both directions; PPE's snapshot arguments."""

# torch leaves Tensor.backward unannotated.
# mypy: disable-error-code="no-untyped-call"

from __future__ import annotations

import os
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from ppe_extensions._snapshot import SnapshotMode, load_snapshot, manifest_path

import ppe_core
from ppe_core.errors import SnapshotError, SnapshotVerificationWarning


def _ppe() -> types.ModuleType:
    import pytorch_pfn_extras

    return pytorch_pfn_extras


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(3, 1)

    def forward(self, x: torch.Tensor, t: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"loss": F.mse_loss(self.fc(x), t)}


def _pairs() -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(1)
    return [(torch.randn(4, 3, generator=g), torch.randn(4, 1, generator=g)) for _ in range(5)]


def _dicts() -> list[dict[str, torch.Tensor]]:
    return [{"x": x, "t": t} for x, t in _pairs()]


def _weights(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def _snapshot_files(out: Path) -> list[str]:
    return sorted(p.name for p in out.iterdir() if p.name.startswith("snapshot_iter_"))


# ------------------------------------------------------------------------- manual manager


def _manager(lib: types.ModuleType, out: Path, **snapshot_kwargs: Any) -> tuple[Any, Net]:
    torch.manual_seed(0)
    model = Net()
    optimizer = torch.optim.Adam(model.parameters(), lr=0.05)
    E = lib.training.extensions
    manager = lib.training.ExtensionsManager(
        model,
        optimizer,
        4,
        iters_per_epoch=5,
        out_dir=str(out),
        extensions=[E.LogReport(), E.snapshot(**snapshot_kwargs)],
    )
    return manager, model


def _run(lib: types.ModuleType, manager: Any, model: Net, epochs: int | None = None) -> None:
    batches: Iterator[tuple[torch.Tensor, torch.Tensor]] = iter(_pairs() * 4)
    epoch = 0
    while not manager.stop_trigger and (epochs is None or epoch < epochs):
        for _ in range(5):
            x, t = next(batches)
            with manager.run_iteration(step_optimizers=["main"]):
                loss = model(x, t)["loss"]
                lib.reporting.report({"loss": loss}, model)
                loss.backward()
        epoch += 1


def test_ppe_snapshots_autoload_into_a_ppe_core_manager(tmp_path: Path) -> None:
    ppe = _ppe()
    reference, ref_model = _manager(ppe, tmp_path / "ref")
    _run(ppe, reference, ref_model)

    out = tmp_path / "run"
    first, first_model = _manager(ppe, out)
    _run(ppe, first, first_model, epochs=2)
    assert _snapshot_files(out) == ["snapshot_iter_10", "snapshot_iter_5"]

    resumed, model = _manager(ppe_core, out, autoload=True)
    assert resumed.iteration == 10  # restored from PPE's newest snapshot, not restarted
    assert resumed.get_extension("_Snapshot").loaded_from == str(out / "snapshot_iter_10")
    _run(ppe_core, resumed, model)
    assert resumed.iteration == 20
    for key, value in _weights(ref_model).items():
        assert torch.equal(value, model.state_dict()[key]), key
    # PPE's files are kept; the new ones come with manifests.
    assert _snapshot_files(out) == [
        "snapshot_iter_10",
        "snapshot_iter_15",
        "snapshot_iter_20",
        "snapshot_iter_5",
    ]
    assert not os.path.exists(manifest_path(str(out / "snapshot_iter_10")))
    assert os.path.exists(manifest_path(str(out / "snapshot_iter_20")))


def test_ppe_core_snapshots_autoload_into_a_ppe_manager(tmp_path: Path) -> None:
    ppe = _ppe()
    reference, ref_model = _manager(ppe_core, tmp_path / "ref")
    _run(ppe_core, reference, ref_model)

    out = tmp_path / "run"
    first, first_model = _manager(ppe_core, out)
    _run(ppe_core, first, first_model, epochs=2)
    resumed, model = _manager(ppe, out, autoload=True)
    assert resumed.iteration == 10  # PPE's autoload never picks a (hidden) manifest
    _run(ppe, resumed, model)
    for key, value in _weights(ref_model).items():
        assert torch.equal(value, model.state_dict()[key]), key


def test_a_torn_ppe_snapshot_falls_back_to_the_previous_one(tmp_path: Path) -> None:
    ppe = _ppe()
    first, first_model = _manager(ppe, tmp_path)
    _run(ppe, first, first_model, epochs=2)
    newest = tmp_path / "snapshot_iter_10"
    newest.write_bytes(newest.read_bytes()[:300])
    resumed, _ = _manager(ppe_core, tmp_path, autoload=True)
    with pytest.warns(SnapshotVerificationWarning, match="snapshot_iter_10"):
        assert resumed.iteration == 5


# ------------------------------------------------------------------------- create_trainer


def _trainer(lib: types.ModuleType, out: Path, epochs: int, **snapshot_kwargs: Any) -> Any:
    torch.manual_seed(0)
    model = lib.to(Net(), "cpu")
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    return lib.engine.create_trainer(
        model,
        optimizer,
        epochs,
        out_dir=str(out),
        extensions=[lib.training.extensions.snapshot(**snapshot_kwargs)],
    )


def test_ppe_trainer_snapshot_resumes_a_ppe_core_trainer(tmp_path: Path) -> None:
    ppe = _ppe()
    reference = _trainer(ppe, tmp_path / "ref", 3)
    reference.run(_dicts())
    _trainer(ppe, tmp_path / "run", 2).run(_dicts())

    resumed = _trainer(ppe_core, tmp_path / "run", 3, autoload=True)
    resumed.run(_dicts())
    assert resumed.iteration == 15
    assert resumed.manager.get_extension("_Snapshot").loaded_from.endswith("snapshot_iter_10")
    for key, value in _weights(reference.models["main"]).items():
        assert torch.equal(value, resumed.models["main"].state_dict()[key]), key
    # ppe-core's own snapshot holds its resume data (and the run's world size) under a key
    # PPE ignores.
    state = load_snapshot(str(tmp_path / "run" / "snapshot_iter_15"))
    assert state["_ppe_core"].keys() == {
        "version",
        "manager",
        "trainer_state",
        "world_size",
        "elapsed_time",
    }
    assert (state["ppe_version"], state["_ppe_core"]["version"]) == ("0.9.0", ppe_core.__version__)
    assert state["_ppe_core"]["world_size"] == 1


def test_ppe_core_trainer_snapshot_resumes_a_ppe_trainer(tmp_path: Path) -> None:
    ppe = _ppe()
    reference = _trainer(ppe_core, tmp_path / "ref", 3)
    reference.run(_dicts())
    _trainer(ppe_core, tmp_path / "run", 2).run(_dicts())

    resumed = _trainer(ppe, tmp_path / "run", 3, autoload=True)
    resumed.run(_dicts())  # no version warning: ppe-core writes PPE 0.9.0's format
    assert resumed.manager.iteration == 15
    for key, value in _weights(reference.models["main"]).items():
        assert torch.equal(value, resumed.models["main"].state_dict()[key]), key


def test_trainer_snapshot_keeps_the_grad_scaler_state_in_ppe_s_place(tmp_path: Path) -> None:
    def build(out: Path, scale: float) -> tuple[Any, torch.amp.GradScaler]:
        torch.manual_seed(0)
        model = ppe_core.to(Net(), "cpu")
        scaler = torch.amp.GradScaler("cpu", init_scale=scale, growth_interval=1)
        trainer = ppe_core.engine.create_trainer(
            model,
            torch.optim.SGD(model.parameters(), lr=0.1),
            2,
            out_dir=str(out),
            extensions=[ppe_core.training.extensions.snapshot(autoload=True)],
            options={"grad_scaler": scaler},
        )
        return trainer, scaler

    trainer, scaler = build(tmp_path, 4.0)
    trainer.run(_dicts())
    state = load_snapshot(str(tmp_path / "snapshot_iter_10"))
    saved = state["state_objects"]["options___::__grad_scaler"]
    assert saved["scale"] == scaler.get_scale() > 4.0  # it grew every step
    assert state["_ppe_core"]["handler"]["grad_scaler"]["scale"] == saved["scale"]

    # A PPE-written state (no '_ppe_core' entry) restores the scaler from 'state_objects'.
    del state["_ppe_core"]
    resumed, resumed_scaler = build(tmp_path / "other", 1.0)
    resumed.load_state_dict(state)
    resumed.run(_dicts())
    assert resumed.iteration == 10  # already done: nothing ran
    assert resumed_scaler.get_scale() == saved["scale"]


# ------------------------------------------------------------------------- PPE's arguments


def test_snapshot_object_of_a_dict_with_a_callable_filename(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = Net()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    E = ppe_core.training.extensions
    manager = ppe_core.training.ExtensionsManager(
        model,
        optimizer,
        3,
        iters_per_epoch=2,
        out_dir=str(tmp_path),
        extensions=[
            E.snapshot_object(
                {"model": model, "optimizer": optimizer},
                lambda m: f"pair_{m.epoch}.pt",
                n_retains=2,
            )
        ],
    )
    _run_plain(manager, model, 6)
    assert sorted(p for p in os.listdir(tmp_path) if p.startswith("pair")) == [
        "pair_2.pt",
        "pair_3.pt",
    ]
    state = load_snapshot(str(tmp_path / "pair_3.pt"))
    assert set(state) == {"model", "optimizer"}
    for key, value in model.state_dict().items():
        assert torch.equal(state["model"][key], value)

    fresh_model = Net()
    fresh_optimizer = torch.optim.SGD(fresh_model.parameters(), lr=0.1)
    loader = E.snapshot_object(
        {"model": fresh_model, "optimizer": fresh_optimizer}, "pair_{.epoch}.pt", autoload=True
    )
    restorer = ppe_core.training.ExtensionsManager(
        fresh_model, fresh_optimizer, 3, iters_per_epoch=2, out_dir=str(tmp_path)
    )
    assert loader.initialize(restorer) == "pair_3.pt"  # PPE returns the loaded file's name
    for key, value in model.state_dict().items():
        assert torch.equal(fresh_model.state_dict()[key], value)


def _run_plain(manager: Any, model: Net, n: int) -> None:
    for x, t in (_pairs() * 2)[:n]:
        with manager.run_iteration(step_optimizers=["main"]):
            model(x, t)["loss"].backward()


def test_snapshot_accepts_ppe_s_arguments(tmp_path: Path) -> None:
    E = ppe_core.training.extensions
    assert E.snapshot(snapshot_mode=SnapshotMode.DEFAULT, n_retains=0).n_retains == 0
    assert E.snapshot(savefun=torch.save, filename="s_{.iteration}").filename == "s_{.iteration}"
    assert E.snapshot(writer=ppe_core.writing.SimpleWriter(out_dir=str(tmp_path))).writer
    # PPE's three modes, in PPE's order; DCP is ppe-core's own (torch.distributed.checkpoint).
    assert [mode.name for mode in SnapshotMode] == ["DEFAULT", "DISTRIBUTED", "SHARDED", "DCP"]
    with pytest.raises(SnapshotError, match=r"torch\.distributed"):
        E.snapshot(snapshot_mode=SnapshotMode.DISTRIBUTED, saver_rank=0)
    with pytest.raises(ValueError, match="saver_rank"):
        E.snapshot(snapshot_mode=SnapshotMode.SHARDED)


def test_snapshot_writer_of_its_own_is_finalized(tmp_path: Path) -> None:
    writer = ppe_core.writing.ThreadWriter(out_dir=str(tmp_path))
    torch.manual_seed(0)
    model = Net()
    manager = ppe_core.training.ExtensionsManager(
        model,
        torch.optim.SGD(model.parameters(), lr=0.1),
        1,
        iters_per_epoch=2,
        out_dir=str(tmp_path),
        extensions=[ppe_core.training.extensions.snapshot(writer=writer)],
    )
    _run_plain(manager, model, 2)  # the stop trigger finalizes the manager and the snapshot
    assert load_snapshot(str(tmp_path / "snapshot_iter_2"))["_start_iteration"] == 2
