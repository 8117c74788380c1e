"""Bad input at the training step, beyond the catalogue rows in test_bad_input.py: batches of
the wrong dtype, losses without a graph, and the cases those checks must leave alone."""

from __future__ import annotations

from typing import Any

import pytest
import torch

import ppe_core as ppe
from ppe_core.errors import BatchDtypeError, NoGradientError, NoGradientWarning


class Regressor(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(3, 1)

    def forward(self, x: torch.Tensor, t: torch.Tensor) -> Any:
        return {"loss": torch.nn.functional.mse_loss(self.fc(x), t)}


def batches(n: int = 3, **dtypes: torch.dtype) -> list[dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(0)
    out = []
    for _ in range(n):
        batch = {"x": torch.randn(4, 3, generator=g), "t": torch.randn(4, 1, generator=g)}
        out.append({k: v.to(dtypes.get(k, v.dtype)) for k, v in batch.items()})
    return out


def train(model: torch.nn.Module, data: list[Any], max_epochs: int = 1, **kwargs: Any) -> Any:
    torch.manual_seed(0)
    model = ppe.to(model, "cpu")
    trainer = ppe.engine.create_trainer(
        model, torch.optim.SGD(model.parameters(), lr=0.1), max_epochs, **kwargs
    )
    trainer.run(data)
    return trainer


def says(info: pytest.ExceptionInfo[BaseException], *phrases: str) -> None:
    message = str(info.value)
    missing = [p for p in phrases if p not in message]
    assert not missing, f"{missing} not in message:\n{message}"


# Item 15: a batch whose dtype is not the model's ---------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float64, torch.int64])
def test_batch_of_another_dtype_names_the_key_and_both_dtypes(dtype: torch.dtype) -> None:
    with pytest.raises(BatchDtypeError) as info:
        train(Regressor(), batches(x=dtype))
    says(info, f"'x' is {dtype}", "Regressor's parameters (torch.float32)", "collate_fn")
    assert "'t'" not in str(info.value)  # the float32 target is not blamed
    assert isinstance(info.value, RuntimeError)  # what code catching torch's error expects
    assert "must have the same dtype" in str(info.value.__cause__)


def test_batch_dtype_error_in_a_tuple_batch_and_in_evaluation() -> None:
    class Conv(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = torch.nn.Conv2d(1, 1, 3)

        def forward(self, image: torch.Tensor) -> Any:
            return {"loss": self.conv(image).pow(2).mean()}

    model = ppe.to(Conv(), "cpu")
    evaluator = ppe.engine.create_evaluator(model)
    with pytest.raises(BatchDtypeError) as info:
        evaluator.run([(torch.randn(2, 1, 5, 5, dtype=torch.float64),)])
    says(info, "item 0 is torch.float64", "(torch.float32)", "should be the same")


def test_a_runtime_error_that_is_not_about_dtypes_is_left_alone() -> None:
    with pytest.raises(RuntimeError, match="mat1 and mat2 shapes cannot be multiplied") as info:
        train(Regressor(), [{"x": torch.randn(4, 5), "t": torch.randn(4, 1)}])
    assert not isinstance(info.value, BatchDtypeError)


# Item 16: a loss that cannot train, with the default options --------------------------------


class ItemLoss(Regressor):
    def forward(self, x: torch.Tensor, t: torch.Tensor) -> Any:
        return {"loss": torch.nn.functional.mse_loss(self.fc(x), t).item()}


class DetachedLoss(Regressor):
    def forward(self, x: torch.Tensor, t: torch.Tensor) -> Any:
        return {"loss": torch.nn.functional.mse_loss(self.fc(x), t).detach()}


class NoGradLoss(Regressor):
    def forward(self, x: torch.Tensor, t: torch.Tensor) -> Any:
        with torch.no_grad():
            return {"loss": torch.nn.functional.mse_loss(self.fc(x), t)}


@pytest.mark.parametrize(
    ("model_class", "described"),
    [
        (ItemLoss, "'loss': a float, not a tensor"),
        (DetachedLoss, "'loss': a torch.float32 tensor that does not require grad"),
        (NoGradLoss, "'loss': a torch.float32 tensor that does not require grad"),
    ],
)
def test_loss_without_grad_stops_at_the_first_step(model_class: type, described: str) -> None:
    # The first step warns and goes on (as PPE); the next epoch's start stops the run.
    model = model_class()
    before = model.fc.weight.detach().clone()
    seen: list[int] = []

    @ppe.training.make_extension(trigger=(1, "iteration"))
    def count(manager: Any) -> None:
        seen.append(manager.iteration)

    with pytest.raises(NoGradientError) as info, pytest.warns(NoGradientWarning) as warned:
        train(model, batches(), extensions=[count], max_epochs=2)
    assert len(warned) == 1
    message = str(warned[0].message)
    for phrase in ("first training step backpropagated nothing", described, ".item()"):
        assert phrase in message, message
    assert "parameters are not updated" in message
    says(info, "a whole epoch trained nothing", "no_grad")
    assert seen == [1, 2, 3]  # one epoch, then stopped at the second one's start
    assert torch.equal(model.fc.weight, before)


def test_frozen_model_is_named_as_the_cause() -> None:
    model = Regressor()
    model.requires_grad_(False)
    frozen = r"frozen \(requires_grad=False\)"
    with pytest.raises(NoGradientError) as info, pytest.warns(NoGradientWarning, match=frozen):
        train(model, batches(), max_epochs=2)
    says(info, "frozen (requires_grad=False)")


def test_forward_that_runs_backward_itself_still_trains() -> None:
    class OwnBackward(Regressor):
        def forward(self, x: torch.Tensor, t: torch.Tensor) -> Any:
            loss = torch.nn.functional.mse_loss(self.fc(x), t)
            loss.backward()  # type: ignore[no-untyped-call]
            return {"loss": loss.item()}

    model = OwnBackward()
    before = model.fc.weight.detach().clone()
    train(model, batches())
    assert not torch.equal(model.fc.weight, before)


def test_only_the_first_step_is_checked() -> None:
    class SkipsLaterBatches(Regressor):
        calls = 0

        def forward(self, x: torch.Tensor, t: torch.Tensor) -> Any:
            SkipsLaterBatches.calls += 1
            if SkipsLaterBatches.calls > 1:
                return {"loss": torch.zeros(())}  # e.g. an empty batch: nothing to learn
            return {"loss": torch.nn.functional.mse_loss(self.fc(x), t)}

    model = SkipsLaterBatches()
    before = model.fc.weight.detach().clone()
    train(model, batches())
    assert SkipsLaterBatches.calls == 3
    assert not torch.equal(model.fc.weight, before)  # the first step trained
