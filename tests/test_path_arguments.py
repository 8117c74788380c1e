"""Every public path argument takes a ``str`` or an ``os.PathLike`` (issue 42 item 11).

PPE 0.9 accepts a ``pathlib.Path`` wherever it takes a path and real scripts pass one. Each
case runs a tiny real training twice, once with the ``str`` and once with the ``Path`` form of
the same argument, and checks that the files land where the ``str`` form puts them and read
back (``LogReport.read``, ``load_snapshot``, autoload resume).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest
import torch
from ppe_extensions._snapshot import (
    load_snapshot,
    manifest_path,
    verify_snapshot,
)
from ppe_extensions._tensorboard_writer import TensorBoardWriter

import ppe_core as ppe
from ppe_core.training import extensions as E

# The two forms of one path: the str a script would write, and its pathlib.Path.
Form = Callable[[Any], Any]
FORMS = [pytest.param(os.fspath, id="str"), pytest.param(Path, id="Path")]


def _train(
    out_dir: Any,
    extensions: Sequence[Any],
    *,
    iterations: int = 2,
    writer: Any = None,
    model: torch.nn.Module | None = None,
) -> ppe.training.ExtensionsManager:
    """Runs ``iterations`` real SGD steps of a Linear(2, 1) with ``extensions``."""
    torch.manual_seed(0)
    model = torch.nn.Linear(2, 1) if model is None else model
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    kwargs = {} if writer is None else {"writer": writer}
    manager = ppe.training.ExtensionsManager(
        model,
        optimizer,
        2,
        iters_per_epoch=2,
        out_dir=out_dir,
        extensions=list(extensions),
        **kwargs,
    )
    for _ in range(iterations):
        with manager.run_iteration():
            loss = model(torch.ones(1, 2)).pow(2).sum()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            ppe.reporting.report({"main/loss": loss.item()})
    return manager


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize(
    "writer_class", ["SimpleWriter", "ThreadWriter", "ThreadQueueWriter", "ProcessWriter"]
)
def test_out_dir_of_the_manager_and_of_a_writer(
    form: Form, writer_class: str, tmp_path: Path
) -> None:
    manager_out, writer_out = tmp_path / "manager", tmp_path / "writer"
    _train(form(manager_out), [E.LogReport(trigger=(1, "iteration"))])
    assert len(E.LogReport.read(manager_out / "log")) == 2
    writer = getattr(ppe.writing, writer_class)(out_dir=form(writer_out))
    manager = _train(form(manager_out / "unused"), [E.snapshot()], writer=writer)
    writer.finalize()
    assert manager.out == str(writer_out)
    assert (writer_out / "snapshot_iter_2").is_file()
    assert (writer_out / ".snapshot_iter_2.manifest.json").is_file()
    assert load_snapshot(form(writer_out / "snapshot_iter_2"))["_start_iteration"] == 2


@pytest.mark.parametrize("form", FORMS)
def test_create_trainer_out_dir_and_log_report_filename(form: Form, tmp_path: Path) -> None:
    model = torch.nn.Linear(2, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)

    class Loss(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.net = model

        def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
            return {"loss": self.net(x).pow(2).mean()}

    trainer = ppe.engine.create_trainer(
        ppe.to(Loss(), "cpu"),
        optimizer,
        1,
        out_dir=form(tmp_path / "out"),
        extensions=[E.LogReport(filename=form("logs/log.jsonl"), trigger=(1, "iteration"))],
    )
    trainer.run([{"x": torch.ones(1, 2)}] * 2)
    entries = E.LogReport.read(form(tmp_path / "out" / "logs" / "log.jsonl"))
    assert [entry["iteration"] for entry in entries] == [1, 2]


@pytest.mark.parametrize("form", FORMS)
def test_log_report_filename_plain_and_template(form: Form, tmp_path: Path) -> None:
    _train(
        str(tmp_path),
        [
            E.LogReport(filename=form("log.csv"), trigger=(1, "iteration")),
            E.LogReport(filename=form("log_{iteration}"), trigger=(2, "iteration")),
        ],
    )
    assert len(E.LogReport.read(form(tmp_path / "log.csv"))) == 2
    assert len(E.LogReport.read(form(tmp_path / "log_2"))) == 1


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("argument", ["filename", "log_name"])
def test_profile_report_filename(form: Form, argument: str, tmp_path: Path) -> None:
    report = E.ProfileReport(trigger=(1, "iteration"), **{argument: form("profile.json")})
    _train(str(tmp_path), [report])
    with open(tmp_path / "profile.json") as f:
        assert [entry["iteration"] for entry in json.load(f)] == [1, 2]


@pytest.mark.parametrize("form", FORMS)
def test_snapshot_template_loads_and_autoload_resumes(form: Form, tmp_path: Path) -> None:
    template = form("snapshot_iter_{.iteration}")
    _train(str(tmp_path), [E.snapshot(filename=template, n_retains=1, autoload=True)], iterations=2)
    assert verify_snapshot(form(tmp_path / "snapshot_iter_2"))["iteration"] == 2
    assert manifest_path(form(tmp_path / "snapshot_iter_2")) == str(
        tmp_path / ".snapshot_iter_2.manifest.json"
    )
    resumed = _train(
        str(tmp_path),
        [E.snapshot(filename=template, n_retains=1, autoload=True)],
        iterations=2,
    )
    assert resumed.iteration == 4  # resumed from snapshot_iter_2, then epoch 2
    names = sorted(p for p in os.listdir(tmp_path) if p.startswith("snapshot"))
    assert names == ["snapshot_iter_4"]  # n_retains=1 saw the Path template's series


@pytest.mark.parametrize("form", FORMS)
def test_snapshot_object_filename(form: Form, tmp_path: Path) -> None:
    model = torch.nn.Linear(2, 1)
    _train(
        str(tmp_path),
        [E.snapshot_object(model, form("model_{.iteration}.pt"))],
        model=model,
    )
    state = load_snapshot(form(tmp_path / "model_2.pt"))
    assert torch.equal(state["weight"], model.weight.detach())


@pytest.mark.parametrize("form", FORMS)
def test_plot_and_trace_filenames_and_tensorboard_out_dir(form: Form, tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    pytest.importorskip("tensorboard")
    model = torch.nn.Linear(2, 1)
    _train(
        str(tmp_path),
        [
            E.PlotReport(["main/loss"], filename=form("plots/loss.png"), trigger=(2, "iteration")),
            E.PlotReport(["main/loss"], file_name=form("old.png"), trigger=(2, "iteration")),
            E.VariableStatisticsPlot(model, filename=form("stats.png"), trigger=(2, "iteration")),
            E.VariableStatisticsPlot(
                model, file_name=form("old_stats.png"), trigger=(2, "iteration")
            ),
            E.TimelineTrace(filename=form("trace.json"), trigger=(2, "iteration")),
            E.TensorBoard(out_dir=form(tmp_path / "tb"), trigger=(2, "iteration")),
        ],
        model=model,
    )
    for name in ["plots/loss.png", "old.png", "stats.png", "old_stats.png", "trace.json"]:
        assert (tmp_path / name).stat().st_size > 0, name
    assert any(name.startswith("events.out.tfevents") for name in os.listdir(tmp_path / "tb"))


@pytest.mark.parametrize("form", FORMS)
def test_tensorboard_writer_out_dir_is_the_managers_out(form: Form, tmp_path: Path) -> None:
    pytest.importorskip("tensorboard")
    writer = TensorBoardWriter(out_dir=form(tmp_path / "tb"))
    manager = _train(str(tmp_path / "unused"), [], writer=writer)
    writer.finalize()
    assert manager.out == str(tmp_path / "tb")


@pytest.mark.parametrize("form", FORMS)
def test_config_load_path(form: Form, tmp_path: Path) -> None:
    (tmp_path / "base.json").write_text(json.dumps({"lr": 0.5}))
    (tmp_path / "config.json").write_text(json.dumps({"optim": {"import": "base.json"}}))
    config = ppe.config.Config.load_path(form(tmp_path / "config.json"))
    assert config["/optim/lr"] == 0.5


@pytest.mark.parametrize("form", FORMS)
def test_slack_filenames(form: Form, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Without slack_sdk, Slack cannot upload: it warns naming each file (formatted from its
    # template) and still posts. Slack's Web API is answered here (no network in tests).
    import urllib.request

    from ppe_extensions import _slack

    from ppe_core.errors import SlackPostWarning

    class Reply:
        status = 200

        def __enter__(self) -> Reply:
            return self

        def __exit__(self, *exc: object) -> None:
            pass

        def read(self) -> bytes:
            return json.dumps({"ok": True, "ts": "1"}).encode()

    monkeypatch.setattr(_slack, "_slack_sdk_available", False)
    monkeypatch.setattr(urllib.request, "urlopen", lambda request, *a, **k: Reply())
    slack = E.Slack(
        "#exp",
        "It {manager.iteration}",
        token="xoxb-test",
        start_msg=None,
        end_msg=None,
        filenames=[form(tmp_path / "curve_{manager.iteration}.png")],
    )
    with pytest.warns(SlackPostWarning, match="needs slack_sdk") as warned:
        _train(str(tmp_path), [slack], iterations=2)
    assert [str(tmp_path / "curve_2.png") in str(w.message) for w in warned] == [True]
