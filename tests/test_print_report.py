"""Tests of PrintReport: PPE's table format, scheduling and resume, on real training loops."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from helpers import linear_manager
from ppe_extensions._log_report import LogReport
from ppe_extensions._print_report import PrintReport

from ppe_core.errors import ConfigurationError, MissingObservationWarning
from ppe_core.reporting import report

ITERS_PER_EPOCH = 4


def _manager(out: Path, extensions: list[Any], max_epochs: int = 3) -> Any:
    return linear_manager(out, extensions, max_epochs=max_epochs, iters_per_epoch=ITERS_PER_EPOCH)


def _train(manager: Any, iterations: int | None = None, val_from_epoch: int | None = None) -> None:
    model = manager.models["main"]
    generator = torch.Generator().manual_seed(1)
    batches = [(torch.randn(8, 4, generator=generator), torch.randn(8, 1)) for _ in range(4)]
    done = 0
    while not manager.stop_trigger and (iterations is None or done < iterations):
        x, t = batches[manager.iteration % len(batches)]
        with manager.run_iteration(step_optimizers=["main"]):
            loss = F.mse_loss(model(x), t)
            loss.backward()  # type: ignore[no-untyped-call]
            report({"train/loss": loss})
            if val_from_epoch is not None and manager.epoch + 1 >= val_from_epoch:
                report({"val/loss": loss.detach() + 1})
        done += 1


def test_table_matches_ppe_format(tmp_path: Path) -> None:
    out = io.StringIO()
    log_report = LogReport()
    _train(_manager(tmp_path, [log_report, PrintReport(out=out)]))

    lines = out.getvalue().splitlines(keepends=True)
    # Widths are max(len(name), 10), separated by two spaces; the epoch trigger drops
    # the iteration column and elapsed_time comes last.
    assert lines[0] == "epoch       train/loss  elapsed_time\n"
    assert len(lines) == 4
    for line, entry in zip(lines[1:], log_report.log, strict=True):
        assert line[:12] == f"{entry['epoch']:<10d}  "
        assert float(line[12:22]) == pytest.approx(entry["train/loss"], rel=1e-5)
        assert line[22:24] == "  "
        assert float(line[24:36]) == pytest.approx(entry["elapsed_time"], rel=1e-5)
        assert line[36:] == "  \n"
        assert line[12:24] == f"{entry['train/loss']:<10g}  "


def test_explicit_entries_with_missing_values_and_non_float_cells(tmp_path: Path) -> None:
    def decorate(entry: dict[str, Any]) -> None:
        entry["big"] = 123_456_789
        entry["note"] = "ok"

    out = io.StringIO()
    extensions = [
        LogReport(postprocess=decorate),
        PrintReport(["iteration", "big", "note", "missing"], out=out),
    ]
    with pytest.warns(MissingObservationWarning, match="empty column for 'missing'"):
        _train(_manager(tmp_path, extensions, max_epochs=1))

    header, row = out.getvalue().splitlines(keepends=True)
    assert header == "iteration   big         note        missing   \n"
    assert row == "4           123456789   ok                      \n"


def test_iteration_trigger_puts_iteration_first_and_drops_epoch(tmp_path: Path) -> None:
    out = io.StringIO()
    extensions = [LogReport(trigger=(6, "iteration")), PrintReport(out=out)]
    _train(_manager(tmp_path, extensions))
    lines = out.getvalue().splitlines()
    assert lines[0] == "iteration   train/loss  elapsed_time"
    assert [line.split()[0] for line in lines[1:]] == ["6", "12"]


def test_rows_print_in_the_iteration_of_their_entry_whatever_the_order(tmp_path: Path) -> None:
    out = io.StringIO()
    manager = _manager(tmp_path, [PrintReport(out=out), LogReport()])  # PrintReport first
    _train(manager, iterations=4)
    assert out.getvalue().splitlines()[1].startswith("1 ")


def test_print_report_runs_only_when_log_report_can_emit(tmp_path: Path) -> None:
    class CountingPrintReport(PrintReport):
        calls = 0

        def __call__(self, manager: Any) -> None:
            CountingPrintReport.calls += 1
            super().__call__(manager)

    _train(_manager(tmp_path, [LogReport(), CountingPrintReport(out=io.StringIO())]))
    assert CountingPrintReport.calls == 3


def test_header_is_reprinted_when_a_column_appears(tmp_path: Path) -> None:
    out = io.StringIO()
    _train(_manager(tmp_path, [LogReport(), PrintReport(out=out)]), val_from_epoch=2)
    lines = out.getvalue().splitlines()
    assert lines[0] == "epoch       train/loss  elapsed_time"
    assert lines[2] == "epoch       train/loss  val/loss    elapsed_time"
    assert len(lines) == 5


def test_log_report_instance_is_fed_by_print_report(tmp_path: Path) -> None:
    out = io.StringIO()
    own = LogReport()
    print_report = PrintReport(log_report=own, out=out)
    _train(_manager(tmp_path, [print_report]))
    assert len(own.log) == 3
    assert len(out.getvalue().splitlines()) == 4
    state = print_report.state_dict()
    assert state["_printed"] == 3
    assert state["_log_report"]["_log"] == own.state_dict()["_log"]


def test_resume_prints_only_new_rows(tmp_path: Path) -> None:
    first_out = io.StringIO()
    first = _manager(tmp_path, [LogReport(), PrintReport(out=first_out)])
    _train(first, iterations=6)
    torch.save(first.state_dict(), tmp_path / "snapshot")
    assert len(first_out.getvalue().splitlines()) == 2  # header + epoch 1

    resumed_out = io.StringIO()
    resumed = _manager(tmp_path, [LogReport(), PrintReport(out=resumed_out)])
    resumed.load_state_dict(torch.load(tmp_path / "snapshot", weights_only=True))
    _train(resumed)
    lines = resumed_out.getvalue().splitlines()
    assert lines[0] == "epoch       train/loss  elapsed_time"  # once, for the new stream
    assert [line.split()[0] for line in lines[1:]] == ["2", "3"]


def test_bad_log_report_arguments(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match="LogReport instance"):
        PrintReport(log_report=3)  # type: ignore[arg-type]
    manager = _manager(tmp_path, [])
    manager.extend(lambda m: None, name="NotALog")
    manager.extend(PrintReport(log_report="NotALog", out=io.StringIO()))
    with pytest.raises(ConfigurationError, match="not a LogReport"):
        manager.start_extensions()


def test_print_report_reads_the_log_report_through_its_public_api(tmp_path: Path) -> None:
    log_report = LogReport(trigger=(2, "iteration"))
    printer = PrintReport(out=io.StringIO())
    manager = _manager(tmp_path, [log_report, printer])
    assert printer.scheduled_log_report is None  # not resolved before the extensions start
    _train(manager, iterations=3)
    assert printer.scheduled_log_report is log_report
    assert log_report.entry_trigger.unit == "iteration"  # type: ignore[attr-defined]
    assert log_report.num_entries == 1
    assert log_report.entries_since(0) == log_report.log
    assert log_report.entries_since(1) == []
    assert not printer.has_new_entries(manager)  # the entry of iteration 2 was printed
    # Its own trigger follows the LogReport's entry schedule: next due at iteration 4.
    assert printer.trigger.next_check(3, ITERS_PER_EPOCH) == 4  # type: ignore[union-attr]
    fed = PrintReport(log_report=LogReport(), out=io.StringIO())
    assert fed.scheduled_log_report is None  # it feeds its LogReport: due every iteration
    assert fed.trigger.next_check(3, ITERS_PER_EPOCH) == 4  # type: ignore[union-attr]
