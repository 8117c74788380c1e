"""FailOnNonNumber stops real trainings that diverge, naming optimizer and parameters."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from ppe_extensions._fail_on_non_number import FailOnNonNumber

import ppe_core as ppe
from ppe_core.errors import NonFiniteParameterError
from ppe_core.training._manager import ExtensionsManager


class Regressor(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(3, 1)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"loss": torch.nn.functional.mse_loss(self.fc(x), y)}


def make_data(nan_batch: int | None) -> list[dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(0)
    batches = [{"x": torch.randn(4, 3, generator=g), "y": torch.randn(4, 1, generator=g)}]
    batches = batches * 4
    if nan_batch is not None:
        bad = {"x": batches[nan_batch]["x"].clone(), "y": batches[nan_batch]["y"]}
        bad["x"][0, 0] = float("nan")  # one corrupt sample
        batches[nan_batch] = bad
    return batches


def train(tmp_path: Path, nan_batch: int | None, **kwargs: bool) -> ppe.training.Trainer:
    torch.manual_seed(0)
    model = ppe.to(Regressor(), "cpu")
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    trainer = ppe.engine.create_trainer(
        model, optimizer, 2, out_dir=str(tmp_path), extensions=[FailOnNonNumber(**kwargs)]
    )
    trainer.run(make_data(nan_batch))
    return trainer


def test_a_nan_loss_stops_training_at_that_iteration(tmp_path: Path) -> None:
    with pytest.raises(NonFiniteParameterError) as info:
        train(tmp_path, nan_batch=2)
    message = str(info.value)
    assert isinstance(info.value, RuntimeError)  # what PPE raised
    assert "after iteration 3 (epoch 0)" in message
    assert "optimizer 'main'" in message
    assert "main: fc.weight (value has NaN; gradient has NaN)" in message
    assert "main: fc.bias" in message
    assert "lower learning rate" in message and "clip_grad_norm_" in message


def test_finite_training_runs_to_the_end(tmp_path: Path) -> None:
    assert train(tmp_path, nan_batch=None).iteration == 8


def test_check_grad_decides_whether_gradients_count(tmp_path: Path) -> None:
    def run(check_grad: bool) -> int:
        model = torch.nn.Linear(3, 1)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        manager = ExtensionsManager(
            model,
            optimizer,
            1,
            iters_per_epoch=2,
            out_dir=str(tmp_path),
            extensions=[FailOnNonNumber(check_grad=check_grad)],
        )
        x = torch.ones(2, 3)
        for i in range(2):
            with manager.run_iteration():
                # The optimizer never steps: an inf input leaves the weights finite but makes
                # the weight gradients inf.
                if i == 1:
                    x[0, 0] = float("inf")
                optimizer.zero_grad()
                model(x).sum().backward()
        return manager.iteration

    with pytest.raises(NonFiniteParameterError, match=r"main: weight \(gradient has inf\)"):
        run(check_grad=True)
    assert run(check_grad=False) == 2


def test_the_error_names_the_optimizer_that_owns_the_parameter(tmp_path: Path) -> None:
    encoder, decoder = torch.nn.Linear(2, 2), torch.nn.Linear(2, 1)
    optimizers = {
        "enc_opt": torch.optim.SGD(encoder.parameters(), lr=0.1),
        "dec_opt": torch.optim.SGD(decoder.parameters(), lr=1e30),
    }
    manager = ExtensionsManager(
        {"enc": encoder, "dec": decoder},
        optimizers,
        1,
        iters_per_epoch=3,
        out_dir=str(tmp_path),
        extensions=[FailOnNonNumber()],
    )
    with pytest.raises(NonFiniteParameterError) as info:
        for _ in range(3):
            with manager.run_iteration(step_optimizers=["enc_opt", "dec_opt"]):
                # A huge learning rate makes the decoder overflow; the encoder stays finite
                # because its gradient is cut off by detach().
                out = decoder(encoder(torch.ones(1, 2)).detach()) * 1e30
                out.pow(2).sum().backward()
    message = str(info.value)
    assert "optimizer 'dec_opt': dec: weight" in message
    assert "enc_opt" not in message and "enc:" not in message
