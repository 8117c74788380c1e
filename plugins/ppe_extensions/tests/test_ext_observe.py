"""observe_value and observe_lr in real trainings."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from ppe_extensions._value_observation import observe_lr, observe_value

import ppe_core as ppe
from ppe_core.errors import ConfigurationError
from ppe_core.training._extension import PRIORITY_READER, ExtensionEntry, make_extension
from ppe_core.training._manager import ExtensionsManager


class Regressor(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = torch.nn.Linear(3, 3)
        self.head = torch.nn.Linear(3, 1)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"loss": torch.nn.functional.mse_loss(self.head(self.body(x)), y)}


def make_data() -> list[dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(0)
    return [{"x": torch.randn(4, 3, generator=g), "y": torch.randn(4, 1, generator=g)}] * 3


def recorder(rows: list[dict[str, Any]]) -> Any:
    # Registered first and at reader priority: the observers (writers) still run before it.
    @make_extension(trigger=(1, "epoch"), priority=PRIORITY_READER)
    def record(manager: Any) -> None:
        rows.append(dict(manager.observation) | {"iteration": manager.iteration})

    return record


def test_observe_value_and_lr_report_each_epoch(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = ppe.to(Regressor(), "cpu")
    optimizer = torch.optim.SGD(
        [
            {"params": model.body.parameters(), "lr": 0.01},
            {"params": model.head.parameters(), "lr": 0.02},
        ]
    )
    scheduler = torch.optim.lr_scheduler.ExponentialLR(optimizer, gamma=0.5)
    rows: list[dict[str, Any]] = []

    @make_extension(trigger=(1, "epoch"))
    def decay(manager: Any) -> None:
        scheduler.step()

    trainer = ppe.engine.create_trainer(
        model,
        optimizer,
        3,
        out_dir=str(tmp_path),
        extensions=[
            recorder(rows),
            decay,
            observe_lr(optimizer),
            observe_lr(optimizer, param_group=1, observation_key="head_lr"),
            observe_value("twice_iteration", lambda manager: 2 * manager.iteration),
        ],
    )
    trainer.run(make_data())
    assert [r["iteration"] for r in rows] == [3, 6, 9]
    assert [r["twice_iteration"] for r in rows] == [6, 12, 18]
    assert [r["lr"] for r in rows] == pytest.approx([0.01, 0.005, 0.0025])
    assert [r["head_lr"] for r in rows] == pytest.approx([0.02, 0.01, 0.005])
    names = [name for name, _ in trainer.manager.extensions]
    # PPE's names: a duplicate of an unnamed extension is renamed None_1, None_2, ...
    assert {"_observe_value", "None_1", "None_2"} <= set(names)


def test_trigger_can_be_changed_at_registration(tmp_path: Path) -> None:
    model = torch.nn.Linear(2, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.3)
    manager = ExtensionsManager(model, optimizer, 1, iters_per_epoch=4, out_dir=str(tmp_path))
    manager.extend(observe_lr(optimizer), trigger=(2, "iteration"))
    seen = []
    for _ in range(4):
        with manager.run_iteration():
            pass
        seen.append(manager.observation.get("lr"))
    assert seen == [None, 0.3, None, 0.3]


def test_observe_value_defaults_match_ppe() -> None:
    entry = ExtensionEntry(observe_value("x", lambda manager: 1))
    assert entry.name == "_observe_value"
    assert entry.priority == ppe.training.PRIORITY_WRITER
    assert entry.trigger.may_fire(4, 4) and not entry.trigger.may_fire(3, 4)  # once per epoch


def test_bad_arguments_are_rejected_with_the_reason() -> None:
    optimizer = torch.optim.SGD(torch.nn.Linear(2, 1).parameters(), lr=0.1)
    with pytest.raises(ConfigurationError, match="1 parameter group"):
        observe_lr(optimizer, param_group=1)
    with pytest.raises(ConfigurationError, match="callable"):
        observe_value("lr", 0.1)  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="observation_key"):
        observe_value("", lambda manager: 0)
