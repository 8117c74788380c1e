"""BestValue, MaxValue and MinValue on real trainings, and their snapshot state."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import pytest
import torch
from ppe_extensions._best_value import BestValue, MaxValue, MinValue
from ppe_extensions._value_observation import observe_value

import ppe_core as ppe
from ppe_core.errors import BestValueKeyError, NoBestValueError, PPEError
from ppe_core.training._extension import ExtensionEntry

# One value per epoch, reported by observe_value at the end of that epoch.
SCORES = [3.0, 1.0, 2.0, 0.5, 4.0]
ITERS_PER_EPOCH = 3


class Regressor(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(3, 1)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"loss": torch.nn.functional.mse_loss(self.fc(x), y)}


def make_data() -> list[dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(0)
    return [{"x": torch.randn(4, 3, generator=g), "y": torch.randn(4, 1, generator=g)}] * 3


def score(manager: Any) -> float:
    epoch: int = manager.epoch
    return SCORES[epoch - 1]


def train(tmp_path: Path, epochs: int, *extensions: Any, state: Any = None) -> Any:
    torch.manual_seed(0)
    model = ppe.to(Regressor(), "cpu")
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    trainer = ppe.engine.create_trainer(
        model,
        optimizer,
        epochs,
        out_dir=str(tmp_path),
        extensions=[observe_value("score", score), *extensions],
    )
    if state is not None:
        trainer.load_state_dict(state)
    trainer.run(make_data())
    return trainer


def test_min_max_and_custom_best(tmp_path: Path) -> None:
    low, high = MinValue("score"), MaxValue("score")
    near_two = BestValue("score", lambda best, new: abs(new - 2) < abs(best - 2))
    trainer = train(tmp_path, 5, low, high, near_two)
    assert (low.best_value, low.best_epoch, low.best_iteration) == (0.5, 4, 12)
    assert (high.best_value, high.best_epoch, high.best_iteration) == (4.0, 5, 15)
    assert (near_two.best_value, near_two.best_epoch) == (2.0, 3)
    names = {name for name, _ in trainer.manager.extensions}
    assert {"min_value", "max_value", "best_value"} <= names


def test_train_loss_is_tracked_at_the_trigger(tmp_path: Path) -> None:
    seen: list[float] = []

    def record(manager: Any) -> None:
        seen.append(float(manager.observation["train/loss"]))

    low = MinValue("train/loss", trigger=(1, "iteration"))
    train(tmp_path, 2, low, record)
    assert low.best_value == pytest.approx(min(seen))
    assert low.best_iteration == seen.index(min(seen)) + 1


def test_reading_before_a_value_was_seen_raises() -> None:
    best = MinValue("val/loss")
    for read in ("best_value", "best_epoch", "best_iteration"):
        with pytest.raises(NoBestValueError, match="'val/loss'"):
            getattr(best, read)


def test_a_missing_key_raises_a_key_error_like_ppe(tmp_path: Path) -> None:
    best = MinValue("val/loss")
    with pytest.raises(KeyError, match=r'Key "val/loss" not found in the observation.*train/loss'):
        train(tmp_path, 1, best)
    assert issubclass(BestValueKeyError, PPEError)
    with pytest.raises(NoBestValueError):
        _ = best.best_value


def test_state_survives_weights_only_load_and_resume(tmp_path: Path) -> None:
    first = MinValue("score")
    trainer = train(tmp_path, 4, first)
    buffer = io.BytesIO()
    torch.save(trainer.state_dict(), buffer)
    buffer.seek(0)
    state = torch.load(buffer, weights_only=True)
    assert state["extensions"]["min_value"]["extension"]["_best_it"] == 12

    resumed = MinValue("score")
    train(tmp_path, 5, resumed, state=state)  # epoch 5 scores 4.0: not better than 0.5
    assert (resumed.best_value, resumed.best_epoch, resumed.best_iteration) == (0.5, 4, 12)


def test_runs_only_on_its_trigger() -> None:
    entry = ExtensionEntry(MaxValue("val/accuracy", trigger=(2, "epoch")))
    assert entry.trigger.next_check(0, ITERS_PER_EPOCH) == 2 * ITERS_PER_EPOCH
