"""LRScheduler on real trainings: StepLR, ReduceLROnPlateau, waiting, and resuming."""

from __future__ import annotations

import io
import itertools
from pathlib import Path
from typing import Any, Literal

import pytest
import torch
from ppe_extensions._lr_scheduler import LRScheduler
from ppe_extensions._value_observation import observe_lr

import ppe_core as ppe
from ppe_core.errors import ConfigurationError, MissingObservationError
from ppe_core.training._extension import PRIORITY_READER, make_extension
from ppe_core.training._manager import ExtensionsManager


class Classifier(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(4, 2)

    def forward(self, x: torch.Tensor, t: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"loss": torch.nn.functional.cross_entropy(self.fc(x), t)}


def make_data(n: int = 32, batches: int = 1) -> list[dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, 4, generator=g)
    t = (x[:, 0] > 0).long()
    size = n // batches
    return [{"x": x[i : i + size], "t": t[i : i + size]} for i in range(0, n, size)]


def make_model() -> Classifier:
    torch.manual_seed(0)
    return ppe.to(Classifier(), "cpu")


def recorder(rows: list[dict[str, float]]) -> Any:
    @make_extension(trigger=(1, "epoch"), priority=PRIORITY_READER)
    def record(manager: Any) -> None:
        rows.append({k: float(v) for k, v in manager.observation.items()})

    return record


def test_step_lr_halves_every_two_epochs(tmp_path: Path) -> None:
    model = make_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=2, gamma=0.5)
    rows: list[dict[str, float]] = []
    trainer = ppe.engine.create_trainer(
        model,
        optimizer,
        5,
        out_dir=str(tmp_path),
        extensions=[LRScheduler(scheduler), observe_lr(optimizer), recorder(rows)],
    )
    trainer.run(make_data(batches=4))
    # observe_lr (a writer) records the rate each epoch used, before the scheduler steps.
    assert [r["lr"] for r in rows] == [1.0, 1.0, 0.5, 0.5, 0.25]
    assert optimizer.param_groups[0]["lr"] == 0.25  # 5 steps: 0.5 ** (5 // 2)
    assert scheduler.last_epoch == 5


def run_plateau(tmp_path: Path, mode: Literal["min", "max"]) -> tuple[list[float], list[float]]:
    # Full-batch gradient descent on a convex loss with validation on the training data:
    # val/loss strictly decreases, so 'max' mode sees no improvement after the first epoch.
    model = make_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.ReduceLROnPlateau(
        optimizer, mode=mode, factor=0.5, patience=0
    )
    rows: list[dict[str, float]] = []
    trainer = ppe.engine.create_trainer(
        model,
        optimizer,
        5,
        out_dir=str(tmp_path),
        evaluator=ppe.engine.create_evaluator(model),
        extensions=[LRScheduler(scheduler), observe_lr(optimizer), recorder(rows)],
    )
    trainer.run(make_data(), make_data())
    return [r["lr"] for r in rows], [r["val/loss"] for r in rows]


def test_reduce_on_plateau_is_stepped_with_the_evaluators_val_loss(tmp_path: Path) -> None:
    lrs, losses = run_plateau(tmp_path, "max")
    assert all(b < a for a, b in itertools.pairwise(losses))
    assert lrs == [0.1, 0.1, 0.05, 0.025, 0.0125]
    lrs, _ = run_plateau(tmp_path, "min")
    assert lrs == [0.1] * 5


def test_reduce_on_plateau_without_val_loss_says_what_to_do(tmp_path: Path) -> None:
    model = make_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.ReduceLROnPlateau(optimizer)
    trainer = ppe.engine.create_trainer(
        model, optimizer, 2, out_dir=str(tmp_path), extensions=[LRScheduler(scheduler)]
    )
    with pytest.raises(MissingObservationError, match="'val/loss'") as info:
        trainer.run(make_data(batches=2))
    assert isinstance(info.value, ValueError)  # PPE raised ValueError here
    assert "evaluator" in str(info.value) and "step_by_value" in str(info.value)
    assert "train/loss" in str(info.value)  # lists what was reported
    assert trainer.iteration == 2


def test_step_by_value_uses_the_given_key(tmp_path: Path) -> None:
    model = make_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    # In 'max' mode the scheduler's ``best`` is the largest value it was stepped with.
    scheduler = torch.optim.lr_scheduler.ReduceLROnPlateau(optimizer, mode="max", patience=9)
    rows: list[dict[str, float]] = []
    stepper = LRScheduler.step_by_value("train/loss")
    trainer = ppe.engine.create_trainer(
        model,
        optimizer,
        3,
        out_dir=str(tmp_path),
        extensions=[LRScheduler(scheduler, stepper=stepper), recorder(rows)],
    )
    trainer.run(make_data(batches=2))
    assert float(scheduler.best) == max(r["train/loss"] for r in rows)
    assert scheduler.last_epoch == 3


def test_wait_for_first_optimizer_step(tmp_path: Path) -> None:
    def run(wait: bool) -> float:
        model = torch.nn.Linear(2, 1)
        optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
        scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
        extension = LRScheduler(
            scheduler, trigger=(1, "iteration"), wait_for_first_optimizer_step=wait
        )
        manager = ExtensionsManager(
            model, optimizer, 1, iters_per_epoch=4, out_dir=str(tmp_path), extensions=[extension]
        )
        for i in range(4):
            with manager.run_iteration():
                model(torch.ones(3, 2)).sum().backward()
                if i >= 2:  # e.g. a GradScaler skipping the first steps
                    optimizer.step()
        return float(optimizer.param_groups[0]["lr"])

    assert run(wait=True) == 0.25  # stepped after iterations 3 and 4 only
    with pytest.warns(UserWarning, match="before `optimizer.step\\(\\)`"):
        assert run(wait=False) == 0.0625


def test_state_round_trips_through_weights_only_load(tmp_path: Path) -> None:
    def make(epochs: int) -> tuple[Any, torch.optim.Optimizer, Any]:
        model = make_model()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        plateau = torch.optim.lr_scheduler.ReduceLROnPlateau(
            optimizer, mode="max", factor=0.5, patience=0
        )
        trainer = ppe.engine.create_trainer(
            model,
            optimizer,
            epochs,
            out_dir=str(tmp_path),
            evaluator=ppe.engine.create_evaluator(model),
            extensions=[LRScheduler(plateau)],
        )
        return trainer, optimizer, plateau

    full, full_opt, _ = make(4)
    full.run(make_data(), make_data())

    first, _, _ = make(2)
    first.run(make_data(), make_data())
    buffer = io.BytesIO()
    torch.save(first.state_dict(), buffer)
    buffer.seek(0)
    state = torch.load(buffer, weights_only=True)
    assert state["extensions"]["LRScheduler"]["extension"]["scheduler"]["last_epoch"] == 2

    resumed, resumed_opt, plateau = make(4)
    resumed.load_state_dict(state)
    resumed.run(make_data(), make_data())
    assert resumed_opt.param_groups[0]["lr"] == full_opt.param_groups[0]["lr"]
    assert full_opt.param_groups[0]["lr"] == pytest.approx(0.0125)
    assert plateau.last_epoch == 4


def test_rejects_a_non_scheduler() -> None:
    with pytest.raises(ConfigurationError, match="lr_scheduler"):
        LRScheduler(object())  # type: ignore[arg-type]
