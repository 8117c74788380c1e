"""ParameterStatistics on a real training: keys, values, options and scheduling."""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from ppe_extensions._parameter_statistics import ParameterStatistics

import ppe_core as ppe
from ppe_core.errors import ConfigurationError
from ppe_core.training._extension import PRIORITY_READER, make_extension


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.hidden = torch.nn.Linear(3, 4)
        self.out = torch.nn.Linear(4, 1)  # its bias has a single element

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"loss": torch.nn.functional.mse_loss(self.out(self.hidden(x).relu()), y)}


def make_data() -> list[dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(0)
    return [{"x": torch.randn(8, 3, generator=g), "y": torch.randn(8, 1, generator=g)}] * 2


def train(tmp_path: Path, make: Callable[[Net], ParameterStatistics]) -> list[dict[str, Any]]:
    torch.manual_seed(0)
    model = ppe.to(Net(), "cpu")
    rows: list[dict[str, Any]] = []

    @make_extension(trigger=(1, "iteration"), priority=PRIORITY_READER)
    def record(manager: Any) -> None:
        expected = {
            "hidden.weight": model.hidden.weight.detach().clone(),
            "hidden.weight.grad": model.hidden.weight.grad.clone(),  # type: ignore[union-attr]
        }
        rows.append({"observation": dict(manager.observation), "expected": expected})

    trainer = ppe.engine.create_trainer(
        model,
        torch.optim.SGD(model.parameters(), lr=0.1),
        2,
        out_dir=str(tmp_path),
        extensions=[make(model), record],
    )
    trainer.run(make_data())
    return rows


def _epoch_mean(rows: list[dict[str, Any]], name: str, statistic: Callable[..., Any]) -> float:
    """The mean over the epoch's iterations (as PPE reports) of a statistic of a tensor."""
    return sum(float(statistic(r["expected"][name])) for r in rows) / len(rows)


def test_default_statistics_are_the_means_over_each_epoch(tmp_path: Path) -> None:
    rows = train(tmp_path, ParameterStatistics)
    assert [any("/data/" in k for k in r["observation"]) for r in rows] == [
        False,
        True,
        False,
        True,
    ]
    observed, epoch = rows[-1]["observation"], rows[-2:]
    weight, grad = "hidden.weight", "hidden.weight.grad"
    mean = pytest.approx
    assert float(observed["hidden.weight/data/mean"]) == mean(
        _epoch_mean(epoch, weight, torch.mean)
    )
    assert float(observed["hidden.weight/data/std"]) == mean(_epoch_mean(epoch, weight, torch.std))
    assert float(observed["hidden.weight/data/min"]) == mean(_epoch_mean(epoch, weight, torch.min))
    assert float(observed["hidden.weight/data/max"]) == mean(_epoch_mean(epoch, weight, torch.max))
    assert float(observed["hidden.weight/data/zeros"]) == 0.0
    assert float(observed["hidden.weight/grad/mean"]) == mean(_epoch_mean(epoch, grad, torch.mean))
    # Not the epoch-end value: the weights moved during the epoch.
    assert float(observed["hidden.weight/data/max"]) != mean(
        float(epoch[-1]["expected"][weight].max())
    )
    # A one-element tensor has no spread: NaN, without torch's degrees-of-freedom warning.
    assert math.isnan(float(observed["out.bias/data/std"]))
    # Values stay tensors (on the device) for LogReport to average.
    assert isinstance(observed["out.weight/grad/max"], torch.Tensor)
    stats = {"mean", "std", "min", "max", "zeros"}
    params = {"hidden.weight", "hidden.bias", "out.weight", "out.bias"}
    assert {k for k in observed if "/data/" in k or "/grad/" in k} == {
        f"{p}/{a}/{s}" for p in params for a in ("data", "grad") for s in stats
    }


def test_custom_statistics_prefix_and_params_only(tmp_path: Path) -> None:
    def quartiles(x: torch.Tensor) -> torch.Tensor:
        return torch.quantile(x, torch.tensor([0.25, 0.75]))

    def make(model: Net) -> ParameterStatistics:
        extension = ParameterStatistics(
            [model], statistics={"quartile": quartiles}, report_grads=False, prefix="stats"
        )
        extension.register_statistics("norm", lambda x: float(x.norm()))
        return extension

    rows = train(tmp_path, make)
    observed, epoch = rows[-1]["observation"], rows[-2:]
    low = _epoch_mean(epoch, "hidden.weight", lambda w: torch.quantile(w.flatten(), 0.25))
    high = _epoch_mean(epoch, "hidden.weight", lambda w: torch.quantile(w.flatten(), 0.75))
    assert float(observed["stats/hidden.weight/data/quartile/0"]) == pytest.approx(low)
    assert float(observed["stats/hidden.weight/data/quartile/1"]) == pytest.approx(high)
    norm = _epoch_mean(epoch, "hidden.weight", torch.norm)
    assert observed["stats/hidden.weight/data/norm"] == pytest.approx(norm)
    assert not any("/grad/" in k for k in observed)


def test_skip_nan_params_reports_nan_for_every_statistic() -> None:
    layer = torch.nn.Linear(2, 2)
    with torch.no_grad():
        layer.weight[0, 0] = float("nan")
    values = ParameterStatistics(layer, skip_nan_params=True).compute()
    assert all(math.isnan(float(values[f"weight/data/{s}"])) for s in ("mean", "max", "zeros"))
    assert not math.isnan(float(values["bias/data/mean"]))
    assert "weight/grad/mean" not in values  # no gradient yet


def test_links_and_statistics_are_validated() -> None:
    with pytest.raises(ConfigurationError, match=r"torch\.nn\.Module"):
        ParameterStatistics([torch.nn.Linear(1, 1), "fc"])  # type: ignore[list-item]
    with pytest.raises(ConfigurationError, match="'default'"):
        ParameterStatistics(torch.nn.Linear(1, 1), statistics="all")
