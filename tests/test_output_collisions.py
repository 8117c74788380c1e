"""Two extensions that would write one file are refused when the extensions start.

Before this check two LogReports writing ``log`` left it holding iterations [4, 5, 6, 7, 8,
8]; two PlotReports overwrote each other's image; two snapshot series retained and
autoloaded each other's files.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from ppe_extensions._log_report import LogReport
from test_log_report import _manager, _train

from ppe_core.errors import ConfigurationError
from ppe_core.training import ExtensionEntry
from ppe_core.training.extensions import PlotReport, ProfileReport, snapshot


def _refused(tmp_path: Path, extensions: list[Any], file: str) -> None:
    manager = _manager(tmp_path, extensions)
    with pytest.raises(ConfigurationError) as info:
        _train(manager, iterations=1)
    message = str(info.value)
    assert f"would both write {file!r}" in message and "another filename" in message
    assert not list(tmp_path.iterdir())  # nothing was written


def test_two_log_reports_writing_one_file_are_refused_before_the_first_iteration(
    tmp_path: Path,
) -> None:
    first = LogReport(trigger=(1, "iteration"))
    second = LogReport(trigger=(4, "iteration"))
    _refused(tmp_path, [first, second], "log")


def test_a_log_report_and_a_profile_report_of_the_default_name_are_refused(
    tmp_path: Path,
) -> None:
    # Both default to ``log``: each rewrote the file with its own entries.
    _refused(tmp_path, [LogReport(), ProfileReport()], "log")


def test_log_report_templates_that_give_one_name_are_refused(tmp_path: Path) -> None:
    first = LogReport(filename="log_{iteration}.jsonl")
    second = LogReport(filename="./log_{iteration}.jsonl", trigger=(2, "iteration"))
    _refused(tmp_path, [first, second], "log_1234567.jsonl")


def test_two_plot_reports_writing_one_image_are_refused(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    _refused(tmp_path, [PlotReport("train/loss"), PlotReport(["train/loss"])], "plot.png")


def test_two_snapshots_of_one_template_are_refused(tmp_path: Path) -> None:
    extensions = [
        ExtensionEntry(snapshot(), trigger=(2, "iteration")),
        ExtensionEntry(snapshot(filename="snapshot_iter_{.iteration}"), trigger=(3, "iteration")),
    ]
    _refused(tmp_path, extensions, "snapshot_iter_1234567")


def test_a_log_report_and_a_snapshot_of_one_name_are_refused(tmp_path: Path) -> None:
    extensions = [LogReport(filename="state"), snapshot(filename="state")]
    _refused(tmp_path, extensions, "state")


def test_extensions_writing_different_files_train(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    logs = [LogReport(), LogReport(filename="log_{iteration}", trigger=(2, "iteration"))]
    extensions = [*logs, PlotReport("train/loss"), PlotReport("train/loss", filename="b.png")]
    extensions += [snapshot(), snapshot(filename="second_{.epoch}")]
    _train(_manager(tmp_path, extensions))
    assert LogReport.read(tmp_path / "log") == logs[0].log
    assert (tmp_path / "plot.png").exists() and (tmp_path / "b.png").exists()
    assert (tmp_path / "second_3").exists() and (tmp_path / "snapshot_iter_12").exists()


def test_a_template_of_other_manager_fields_is_left_to_the_snapshots_own_check(
    tmp_path: Path,
) -> None:
    # The check formats names without reading the manager's state (that would start it).
    extensions = [snapshot(filename="s_{.is_before_training}"), snapshot(filename="s_{.nope}")]
    with pytest.raises(ConfigurationError, match="cannot be formatted with the manager"):
        _train(_manager(tmp_path, extensions), iterations=1)
