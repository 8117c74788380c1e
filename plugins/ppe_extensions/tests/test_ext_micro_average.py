"""MicroAverage on a real classifier with uneven batches."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import pytest
import torch
from ppe_extensions._micro_average import MicroAverage

import ppe_core as ppe
from ppe_core.training._extension import PRIORITY_READER, make_extension
from ppe_core.training._manager import ExtensionsManager


class Classifier(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(4, 2)

    def forward(self, x: torch.Tensor, t: torch.Tensor) -> dict[str, torch.Tensor]:
        y = self.fc(x)
        return {
            "loss": torch.nn.functional.cross_entropy(y, t),
            "correct": (y.argmax(1) == t).sum(),
            "total": torch.tensor(len(t)),
        }


def make_data() -> list[dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(20, 4, generator=g)
    t = (x[:, 0] > 0).long()
    return [{"x": x[i : i + 8], "t": t[i : i + 8]} for i in (0, 8, 16)]  # 8, 8 and 4 samples


def test_reports_sum_of_numerators_over_sum_of_denominators(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = ppe.to(Classifier(), "cpu")
    steps: list[dict[str, Any]] = []

    @make_extension(trigger=(1, "iteration"), priority=PRIORITY_READER)
    def record(manager: Any) -> None:
        steps.append(dict(manager.observation))

    trainer = ppe.engine.create_trainer(
        model,
        torch.optim.SGD(model.parameters(), lr=0.5),
        3,
        out_dir=str(tmp_path),
        extensions=[MicroAverage("train/correct", "train/total", "train/accuracy"), record],
    )
    trainer.run(make_data())
    for epoch in range(3):
        window = steps[3 * epoch : 3 * epoch + 3]
        expected = sum(int(s["train/correct"]) for s in window) / sum(
            int(s["train/total"]) for s in window
        )
        assert window[-1]["train/accuracy"] == pytest.approx(expected)
        assert isinstance(window[-1]["train/accuracy"], float)
        assert all("train/accuracy" not in s for s in window[:-1])


def test_state_mid_interval_survives_weights_only_load(tmp_path: Path) -> None:
    def manager(extension: MicroAverage) -> ExtensionsManager:
        model = torch.nn.Linear(1, 1)
        return ExtensionsManager(
            model,
            torch.optim.SGD(model.parameters(), lr=0.1),
            1,
            iters_per_epoch=4,
            out_dir=str(tmp_path),
            extensions=[extension],
        )

    first = MicroAverage("n", "d", "ratio")
    m = manager(first)
    for n, d in ((1, 2), (torch.tensor(3), torch.tensor(4))):
        with m.run_iteration():
            ppe.reporting.report({"n": n, "d": d})
    buffer = io.BytesIO()
    torch.save(first.state_dict(), buffer)
    buffer.seek(0)
    state = torch.load(buffer, weights_only=True)
    assert state == {"_numerator": 4, "_denominator": 6}

    resumed = MicroAverage("n", "d", "ratio")
    resumed.load_state_dict(state)
    m = manager(resumed)
    m.iteration = 2
    with m.run_iteration():
        ppe.reporting.report({"n": 0, "d": 1})
    with m.run_iteration():
        pass  # iterations without the keys are skipped
    assert m.observation["ratio"] == pytest.approx(4 / 7)


def test_an_interval_without_counts_reports_nan(tmp_path: Path) -> None:
    model = torch.nn.Linear(1, 1)
    m = ExtensionsManager(
        model,
        torch.optim.SGD(model.parameters(), lr=0.1),
        1,
        iters_per_epoch=1,
        out_dir=str(tmp_path),
        extensions=[MicroAverage("n", "d", "ratio")],
    )
    with m.run_iteration():
        pass
    assert m.observation["ratio"] != m.observation["ratio"]  # NaN
