"""Resuming with another epoch length (dataset length or batch size changed) warns."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader

import ppe_core as ppe
from ppe_core.errors import EpochLengthChangedWarning
from ppe_core.training import ExtensionsManager

E = ppe.training.extensions


class Regressor(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(3, 1)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"loss": torch.nn.functional.mse_loss(self.fc(x).squeeze(1), y)}


def _loader(samples: int, batch_size: int) -> DataLoader[Any]:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(samples, 3, generator=g)
    return DataLoader([{"x": x[i], "y": x[i].sum()} for i in range(samples)], batch_size=batch_size)  # type: ignore[arg-type]


def _trainer(out: Path, epochs: int) -> Any:
    torch.manual_seed(0)
    model = ppe.to(Regressor(), "cpu")
    return ppe.engine.create_trainer(
        model,
        torch.optim.SGD(model.parameters(), lr=0.05),
        epochs,
        out_dir=str(out),
        extensions=[
            E.LogReport(),
            ppe.training.ExtensionEntry(E.snapshot(autoload=True), trigger=(1, "epoch")),
        ],
    )


def test_trainer_resumed_with_another_batch_size_warns_naming_old_and_new(tmp_path: Path) -> None:
    _trainer(tmp_path, 2).run(_loader(32, 8))  # 4 iterations per epoch, snapshot at 8
    resumed = _trainer(tmp_path, 3)
    with pytest.warns(EpochLengthChangedWarning) as record:
        resumed.run(_loader(32, 4))  # 8 iterations per epoch now
    message = str(record[0].message)
    assert "saved with 4 iterations per epoch" in message and "this run has 8" in message
    assert "iteration 8, which was epoch 2.00 and is epoch 1.00 now" in message
    assert "epoch-based triggers" in message and "same dataset and batch size" in message
    assert resumed.manager.get_extension("_Snapshot").loaded_from.endswith("snapshot_iter_8")


def test_trainer_resumed_with_another_dataset_length_warns(tmp_path: Path) -> None:
    trainer = _trainer(tmp_path, 1)
    trainer.run(_loader(32, 8))
    state = trainer.state_dict()
    assert state["_ppe_core"]["manager"] == {"iters_per_epoch": 4}
    again = _trainer(tmp_path / "other", 2)
    again.load_state_dict(state)
    with pytest.warns(EpochLengthChangedWarning, match="saved with 4 .* this run has 5"):
        again.run(_loader(40, 8))


def test_trainer_resumed_with_the_same_epoch_length_does_not_warn(tmp_path: Path) -> None:
    _trainer(tmp_path, 1).run(_loader(32, 8))
    resumed = _trainer(tmp_path, 2)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        resumed.run(_loader(32, 8))
    assert resumed.iteration == 8


def test_manual_loop_manager_loaded_with_another_epoch_length_warns() -> None:
    model = torch.nn.Linear(2, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    saved = ExtensionsManager(model, optimizer, 3, iters_per_epoch=10)
    for _ in range(15):
        with saved.run_iteration():
            pass
    state = saved.state_dict()
    same = ExtensionsManager(model, optimizer, 3, iters_per_epoch=10)
    same.load_state_dict(state)  # no warning: filterwarnings = error would fail here
    other = ExtensionsManager(model, optimizer, 3, iters_per_epoch=5)
    with pytest.warns(EpochLengthChangedWarning, match=r"saved with 10 .* has 5 .*epoch 1\.50"):
        other.load_state_dict(state)
    assert other.epoch == 3  # the iteration is kept; the epoch it falls in is not


def _ignite_run(out: Path, batches: int, state: dict[str, Any] | None = None) -> Any:
    with warnings.catch_warnings():
        # Importing ignite 0.5 scripts a function with the deprecated torch.jit.script.
        warnings.simplefilter("ignore", DeprecationWarning)
        from ignite.engine import create_supervised_trainer

    torch.manual_seed(0)
    model = torch.nn.Linear(3, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    engine = create_supervised_trainer(model, optimizer, torch.nn.functional.mse_loss)
    manager = ppe.training.manager.IgniteExtensionsManager(
        engine, model, optimizer, 2, out_dir=str(out), extensions=[E.LogReport()]
    )
    if state is not None:
        manager.load_state_dict(state)  # before the engine knows its epoch length: no check yet
    data = [(torch.randn(2, 3), torch.randn(2, 1)) for _ in range(batches)]
    engine.run(data, max_epochs=2)
    return manager


def test_ignite_manager_checks_once_the_engine_knows_its_epoch_length(tmp_path: Path) -> None:
    state = _ignite_run(tmp_path, 5).state_dict()
    _ignite_run(tmp_path, 5, state)  # same length: no warning
    with pytest.warns(EpochLengthChangedWarning, match="saved with 5 .* this run has 4"):
        _ignite_run(tmp_path, 4, state)
