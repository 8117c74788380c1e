"""PlotReport, ProfileReport and TensorBoard output on real trainings, and their extras."""

from __future__ import annotations

import io
import json
import sys
import types
from pathlib import Path
from typing import IO, Any

import pytest
import torch
from ppe_extensions._plot_report import PlotReport
from ppe_extensions._profile_report import ProfileReport, TimeSummary
from ppe_extensions._tensorboard import TensorBoard

import ppe_core as ppe
from ppe_core.errors import ConfigurationError, NoPlotDataWarning, OptionalDependencyError
from ppe_core.training._extension import PRIORITY_READER, make_extension
from ppe_core.writing import TensorBoardWriter


class Regressor(torch.nn.Module):
    def __init__(self, timer: TimeSummary | None = None) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(3, 1)
        self.timer = timer

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> dict[str, torch.Tensor]:
        if self.timer is None:
            return {"loss": torch.nn.functional.mse_loss(self.fc(x), y)}
        with self.timer.report("forward"):
            out = self.fc(x)
        return {"loss": torch.nn.functional.mse_loss(out, y)}


def make_data() -> list[dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(0)
    return [{"x": torch.randn(4, 3, generator=g), "y": torch.randn(4, 1, generator=g)}] * 3


def train(
    tmp_path: Path, epochs: int, *extensions: Any, timer: TimeSummary | None = None
) -> tuple[Any, list[dict[str, Any]]]:
    """Trains with an evaluator; returns the trainer and every iteration's observation."""
    torch.manual_seed(0)
    model = ppe.to(Regressor(timer), "cpu")
    steps: list[dict[str, Any]] = []

    @make_extension(trigger=(1, "iteration"), priority=PRIORITY_READER - 1)
    def record(manager: Any) -> None:
        steps.append(dict(manager.observation) | {"iteration": manager.iteration})

    trainer = ppe.engine.create_trainer(
        model,
        torch.optim.SGD(model.parameters(), lr=0.1),
        epochs,
        out_dir=str(tmp_path),
        evaluator=ppe.engine.create_evaluator(model),
        extensions=[*extensions, record],
    )
    trainer.run(make_data(), make_data())
    return trainer, steps


def epoch_means(steps: list[dict[str, Any]], key: str) -> list[float]:
    return [sum(float(s[key]) for s in steps[i : i + 3]) / 3 for i in range(0, len(steps), 3)]


# PlotReport -----------------------------------------------------------------------------------


def test_plot_report_without_matplotlib_names_the_extra(hide_module: Any) -> None:
    hide_module("matplotlib")
    assert PlotReport.available() is False
    with pytest.raises(OptionalDependencyError, match=r"pip install 'ppe-core\[plot\]'"):
        PlotReport(["train/loss"])


class _FakeAxes:
    def __init__(self) -> None:
        self.lines: dict[str, Any] = {}
        self.xlabel = ""
        self.gridded = False

    def set_xlabel(self, label: str) -> None:
        self.xlabel = label

    def grid(self) -> None:
        self.gridded = True

    def plot(self, xs: list[float], ys: list[float], *, marker: Any, label: str) -> None:
        self.lines[label] = {"x": list(xs), "y": list(ys), "marker": marker}

    def has_data(self) -> bool:
        return bool(self.lines)

    def legend(self, **kwargs: Any) -> str:
        return "legend"


class _FakeFigure:
    """Stands in for ``matplotlib.figure.Figure``: 'renders' the plotted lines as JSON."""

    def __init__(self) -> None:
        self.axes = _FakeAxes()

    def add_subplot(self, spec: int) -> _FakeAxes:
        return self.axes

    def savefig(self, file_obj: IO[bytes], *, format: str, **kwargs: Any) -> None:
        axes = self.axes
        image = {"format": format, "xlabel": axes.xlabel, "grid": axes.gridded}
        file_obj.write(json.dumps(image | {"lines": axes.lines}).encode())


@pytest.fixture
def fake_matplotlib(monkeypatch: pytest.MonkeyPatch) -> None:
    """matplotlib is an optional extra that is not installed here: provide its Figure."""
    package = types.ModuleType("matplotlib")
    figure = types.ModuleType("matplotlib.figure")
    figure.Figure = _FakeFigure  # type: ignore[attr-defined]
    package.figure = figure  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "matplotlib", package)
    monkeypatch.setitem(sys.modules, "matplotlib.figure", figure)


@pytest.mark.usefixtures("fake_matplotlib")
def test_plot_report_plots_epoch_means_through_the_writer(tmp_path: Path) -> None:
    plot = PlotReport(["train/loss", "val/loss"], "epoch", filename="loss.svg", marker="o")
    _, steps = train(tmp_path, 3, plot)
    image = json.loads((tmp_path / "loss.svg").read_text())
    assert image["format"] == "svg" and image["xlabel"] == "epoch" and image["grid"]
    train_line, val_line = image["lines"]["train/loss"], image["lines"]["val/loss"]
    assert train_line["x"] == val_line["x"] == [1.0, 2.0, 3.0]
    assert train_line["marker"] == "o"
    assert train_line["y"] == pytest.approx(epoch_means(steps, "train/loss"))
    assert val_line["y"] == pytest.approx([float(s["val/loss"]) for s in steps[2::3]])
    assert [p.name for p in tmp_path.iterdir()] == ["loss.svg"]  # no temporary file left
    assert plot.data["val/loss"] == list(zip(val_line["x"], val_line["y"], strict=True))


@pytest.mark.usefixtures("fake_matplotlib")
def test_plot_report_state_resumes_the_curve(tmp_path: Path) -> None:
    first = PlotReport("val/loss")
    trainer, _ = train(tmp_path, 2, first)
    buffer = io.BytesIO()
    torch.save(trainer.state_dict(), buffer)
    buffer.seek(0)
    state = torch.load(buffer, weights_only=True)
    resumed = PlotReport("val/loss")
    resumed.load_state_dict(state["extensions"]["PlotReport"]["extension"])
    assert resumed.data == first.data
    assert [x for x, _ in resumed.data["val/loss"]] == [3.0, 6.0]  # x_key='iteration'


@pytest.mark.usefixtures("fake_matplotlib")
def test_plot_report_warns_when_no_key_was_reported(tmp_path: Path) -> None:
    with pytest.warns(NoPlotDataWarning, match="'val/acc'"):
        train(tmp_path, 1, PlotReport(["val/acc"]))
    assert not (tmp_path / "plot.png").exists()


def test_plot_report_with_real_matplotlib_writes_a_png(tmp_path: Path) -> None:
    train(tmp_path, 2, PlotReport(["train/loss", "val/loss"]))
    assert (tmp_path / "plot.png").read_bytes().startswith(b"\x89PNG")


# ProfileReport --------------------------------------------------------------------------------


def test_profile_report_logs_and_reports_timing_statistics(tmp_path: Path) -> None:
    timer = TimeSummary()
    profile = ProfileReport(report_keys=["forward"], filename="profile", time_summary=timer)
    _, steps = train(tmp_path, 2, profile, timer=timer)
    log = json.loads((tmp_path / "profile").read_text())
    assert [e["iteration"] for e in log] == [3, 6] and [e["epoch"] for e in log] == [1, 2]
    assert set(log[0]) == {"forward", "forward.std", "epoch", "iteration", "elapsed_time"}
    assert all(e["forward"] > 0 for e in log)
    assert [s["time.forward"] for s in steps if "time.forward" in s] == [e["forward"] for e in log]
    assert profile.log == log


def test_profile_report_appends_json_lines_and_filters_keys(tmp_path: Path) -> None:
    timer = TimeSummary()
    timer.add("data", 0.5)
    profile = ProfileReport(
        store_keys=["data"], filename="profile.jsonl", append=True, time_summary=timer
    )
    trainer, _ = train(tmp_path, 2, profile, timer=timer)
    lines = (tmp_path / "profile.jsonl").read_text().splitlines()
    entries = [json.loads(line) for line in lines]
    assert [e["iteration"] for e in entries] == [3, 6]
    assert entries[0]["data"] == 0.5 and "forward" not in entries[0]
    assert "data" not in entries[1]  # nothing recorded under 'data' in the second epoch
    assert profile.log == []  # appended entries are not kept in memory
    state = trainer.state_dict()["extensions"]["ProfileReport"]["extension"]
    assert json.loads(state["_log"]) == []


def test_time_summary_records_a_section_that_raises() -> None:
    timer = TimeSummary()
    with pytest.raises(KeyError), timer.report("lookup"):
        raise KeyError("x")
    with timer.summary(clear=True) as summary:
        assert set(summary.compute_mean()) == {"lookup"}
    with timer.summary() as summary:
        assert summary.compute_mean() == {}


def test_profile_report_rejects_bad_formats() -> None:
    with pytest.raises(ConfigurationError, match="json-lines"):
        ProfileReport(append=True)
    with pytest.raises(ConfigurationError, match="'xml'"):
        ProfileReport(format="xml")


def test_profile_report_yaml_without_pyyaml_names_the_package(hide_module: Any) -> None:
    hide_module("yaml")
    with pytest.raises(OptionalDependencyError, match="pyyaml"):
        ProfileReport(filename="profile.yaml")


# TensorBoard ----------------------------------------------------------------------------------


class RecordingSummaryWriter:
    """Stands in for torch.utils.tensorboard.SummaryWriter (the tensorboard extra)."""

    def __init__(self) -> None:
        self.scalars: list[tuple[str, float, int | None]] = []
        self.flushes = 0
        self.closed = False

    def add_scalar(self, tag: str, scalar_value: float, global_step: int | None = None) -> None:
        self.scalars.append((tag, scalar_value, global_step))

    def flush(self) -> None:
        self.flushes += 1

    def close(self) -> None:
        self.closed = True

    def series(self, tag: str) -> list[tuple[int | None, float]]:
        return [(step, value) for t, value, step in self.scalars if t == tag]


def test_tensorboard_without_the_package_names_the_extra(hide_module: Any) -> None:
    hide_module("tensorboard")
    hide_module("torch.utils.tensorboard")
    with pytest.raises(OptionalDependencyError, match=r"pip install 'ppe-core\[tensorboard\]'"):
        TensorBoard()
    with pytest.raises(OptionalDependencyError, match="tensorboard"):
        TensorBoardWriter(out_dir="runs")


def test_tensorboard_extension_sends_interval_means(tmp_path: Path) -> None:
    sink = RecordingSummaryWriter()
    _, steps = train(tmp_path, 3, TensorBoard(sink, keys=["train/loss", "val/loss"]))
    train_loss = sink.series("train/loss")
    assert [step for step, _ in train_loss] == [3, 6, 9]
    assert [v for _, v in train_loss] == pytest.approx(epoch_means(steps, "train/loss"))
    assert [v for _, v in sink.series("val/loss")] == pytest.approx(
        [float(s["val/loss"]) for s in steps[2::3]]
    )
    assert sink.series("epoch") == [(3, 1.0), (6, 2.0), (9, 3.0)]
    assert {tag for tag, _, _ in sink.scalars} == {"train/loss", "val/loss", "epoch"}
    assert sink.flushes == 4 and not sink.closed  # one per interval, one at the end


def test_tensorboard_writer_as_a_log_writer() -> None:
    sink = RecordingSummaryWriter()
    writer = TensorBoardWriter(summary_writer=sink, stats=["main/loss", "missing"])
    log: list[dict[str, Any]] = [
        {"main/loss": 1.0, "epoch": 1, "iteration": 10},
        {"main/loss": torch.tensor(0.5), "epoch": 2, "iteration": 20, "note": "text"},
    ]
    writer("log", "result", log)
    assert sink.scalars == [("main/loss", 0.5, 20)]  # the latest entry only
    with pytest.raises(ConfigurationError, match="'iteration'"):
        writer("log", "result", {"main/loss": 1.0})
    writer.finalize()
    writer.finalize()
    assert sink.flushes == 1 and not sink.closed  # a given SummaryWriter stays open


def test_tensorboard_with_real_tensorboard_writes_events(tmp_path: Path) -> None:
    train(tmp_path, 1, TensorBoard(out_dir=str(tmp_path / "tb")))
    assert any(p.name.startswith("events.out.tfevents") for p in (tmp_path / "tb").iterdir())
