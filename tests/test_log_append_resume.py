"""``LogReport(append=True)`` after a kill and a resume: each entry once, and the file reads back.

A run appending to a log writes entries after its last snapshot before it is killed, and the
kill can tear the entry being written. The resumed run (and a rerun that trains longer from
a finished run's newest snapshot) must end with each iteration once, after what the file held
before the first run.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from ppe_extensions._log_report import LogReport
from test_log_report import _manager, _train

from ppe_core.errors import LogFileError
from ppe_core.writing import ThreadQueueWriter

EARLIER = {"from": "an earlier run", "iteration": 100}
FILENAMES = ["log.jsonl", "log.yaml"]


def _earlier_file(path: Path) -> None:
    """What the file held before the first run (append keeps it)."""
    if path.suffix == ".jsonl":
        path.write_text(json.dumps(EARLIER) + "\n")
    else:
        path.write_text("- from: an earlier run\n  iteration: 100\n")


def _torn(path: Path) -> None:
    """A kill inside an entry's write: part of its first line, without the newline."""
    with open(path, "a") as f:
        f.write('{"train/loss": 0.12' if path.suffix == ".jsonl" else "- elapsed_time: 0.1")


def _without_time(entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{k: v for k, v in e.items() if k != "elapsed_time"} for e in entries]


@pytest.fixture(scope="module")
def straight(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    """The log of an uninterrupted run (every iteration, 3 epochs of 4)."""
    report = LogReport(trigger=(1, "iteration"))
    _train(_manager(tmp_path_factory.mktemp("straight"), [report]))
    return report.log


@pytest.mark.parametrize("filename", FILENAMES)
def test_a_resumed_append_log_holds_each_iteration_once_after_the_earlier_lines(
    tmp_path: Path, filename: str, straight: list[dict[str, Any]]
) -> None:
    path = tmp_path / filename
    _earlier_file(path)
    first = _manager(
        tmp_path, [LogReport(trigger=(1, "iteration"), filename=filename, append=True)]
    )
    _train(first, iterations=7)
    torch.save(first.state_dict(), tmp_path / "snapshot")
    _train(first, iterations=4)  # entries 8-11 after the snapshot, as a killed run leaves them
    _torn(path)  # and the kill tore entry 12's write

    resumed_report = LogReport(trigger=(1, "iteration"), filename=filename, append=True)
    resumed = _manager(tmp_path, [resumed_report])
    resumed.load_state_dict(torch.load(tmp_path / "snapshot", weights_only=True))
    _train(resumed)

    got = LogReport.read(path)
    assert got == [EARLIER, *resumed_report.log]
    assert [e["iteration"] for e in got[1:]] == list(range(1, 13))
    assert _without_time(got[1:]) == _without_time(straight)


def test_a_state_without_the_file_count_keeps_the_file_up_to_its_newest_restored_entry(
    tmp_path: Path,
) -> None:
    # PPE's LogReport saves no count of the file's entries: the restored log tells.
    path = tmp_path / "log.jsonl"
    _earlier_file(path)
    first = _manager(
        tmp_path, [LogReport(trigger=(1, "iteration"), filename="log.jsonl", append=True)]
    )
    _train(first, iterations=7)
    state = first.state_dict()
    torch.save(state, tmp_path / "snapshot")
    _train(first, iterations=4)
    _torn(path)
    loaded = torch.load(tmp_path / "snapshot", weights_only=True)
    del loaded["extensions"]["LogReport"]["extension"]["_file_entries"]

    resumed_report = LogReport(trigger=(1, "iteration"), filename="log.jsonl", append=True)
    resumed = _manager(tmp_path, [resumed_report])
    resumed.load_state_dict(loaded)
    _train(resumed)
    assert LogReport.read(path) == [EARLIER, *resumed_report.log]
    assert [e["iteration"] for e in resumed_report.log] == list(range(1, 13))


@pytest.mark.parametrize("filename", FILENAMES)
def test_a_snapshot_before_the_first_entry_drops_what_the_killed_run_appended(
    tmp_path: Path, filename: str
) -> None:
    path = tmp_path / filename
    _earlier_file(path)
    first = _manager(tmp_path, [LogReport(filename=filename, append=True)])  # once per epoch
    _train(first, iterations=2)
    torch.save(first.state_dict(), tmp_path / "snapshot")  # the log is still empty
    _train(first, iterations=4)  # the entry of iteration 4, after the snapshot

    resumed_report = LogReport(filename=filename, append=True)
    resumed = _manager(tmp_path, [resumed_report])
    resumed.load_state_dict(torch.load(tmp_path / "snapshot", weights_only=True))
    _train(resumed)

    got = LogReport.read(path)
    assert got == [EARLIER, *resumed_report.log]
    assert [e["iteration"] for e in got[1:]] == [4, 8, 12]


@pytest.mark.parametrize("filename", FILENAMES)
def test_a_torn_last_line_is_dropped_before_a_new_run_appends(
    tmp_path: Path, filename: str
) -> None:
    path = tmp_path / filename
    _earlier_file(path)
    _torn(path)  # a run without snapshots killed inside a write
    report = LogReport(filename=filename, append=True)
    _train(_manager(tmp_path, [report]))
    assert LogReport.read(path) == [EARLIER, *report.log]


def test_entries_a_background_writer_had_not_written_when_killed_are_written_at_resume(
    tmp_path: Path,
) -> None:
    path = tmp_path / "log.jsonl"
    first = _manager(
        tmp_path, [LogReport(trigger=(1, "iteration"), filename="log.jsonl", append=True)]
    )
    _train(first, iterations=7)
    torch.save(first.state_dict(), tmp_path / "snapshot")
    _train(first, iterations=2)
    # The kill came before the writer thread wrote entries 6-9 (only 1-5 reached the file).
    lines = path.read_text().splitlines(keepends=True)
    path.write_text("".join(lines[:5]))

    resumed_report = LogReport(trigger=(1, "iteration"), filename="log.jsonl", append=True)
    writer = ThreadQueueWriter(out_dir=str(tmp_path))
    resumed = _manager(tmp_path, [resumed_report], writer=writer)
    resumed.load_state_dict(torch.load(tmp_path / "snapshot", weights_only=True))
    _train(resumed)  # the stop trigger finalizes the writer

    got = LogReport.read(path)
    assert got == resumed_report.log
    assert [e["iteration"] for e in got] == list(range(1, 13))


# --- a log damaged before its end: a clear error ----------------------------------------------


@pytest.mark.parametrize("cut", [0, 10])
def test_a_csv_log_truncated_in_place_mid_run_is_refused_by_name(tmp_path: Path, cut: int) -> None:
    report = LogReport(trigger=(1, "iteration"), filename="log.csv")
    manager = _manager(tmp_path, [report])
    _train(manager, iterations=3)
    os.truncate(tmp_path / "log.csv", cut)  # e.g. `: > log.csv` while it trains
    _train(manager)  # the rows still go to the file's end, without a header
    with pytest.raises(LogFileError) as info:
        LogReport.read(tmp_path / "log.csv")
    message = str(info.value)
    assert str(tmp_path / "log.csv") in message and "is not a header" in message
    assert "resume the run from its newest snapshot" in message


def test_a_csv_row_with_fewer_cells_and_a_damaged_json_line_name_the_place(tmp_path: Path) -> None:
    (tmp_path / "log.csv").write_text("a,iteration\n1,1\n2\n3,3\n")
    with pytest.raises(LogFileError, match=r"row 2 has fewer cells than the header \(the 1"):
        LogReport.read(tmp_path / "log.csv")
    (tmp_path / "log.jsonl").write_text('{"iteration": 1}\n{"iter{"iteration": 3}\n{"x": 4}\n')
    with pytest.raises(LogFileError, match=r"log\.jsonl: line 2 is not JSON"):
        LogReport.read(tmp_path / "log.jsonl")


# --- a real SIGKILL and autoload ---------------------------------------------------------------

SCRIPT = Path(__file__).parent / "scripts" / "logging_training.py"


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PPE_")}
    env["OMP_NUM_THREADS"] = "1"
    return env


def _run(out: Path, iterations: int, kill_at: int | None = None) -> None:
    """Runs the script appending to ``log.jsonl``; it SIGKILLs itself after ``kill_at``."""
    command = [sys.executable, str(SCRIPT), str(out), "log.jsonl", "--append"]
    command += ["--iterations", str(iterations)]
    if kill_at is not None:
        command += ["--kill-at", str(kill_at)]
    done = subprocess.run(command, capture_output=True, text=True, env=_env(), timeout=120)
    assert done.returncode == (0 if kill_at is None else -signal.SIGKILL), done.stderr


@pytest.fixture(scope="module")
def straight_run(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    """The log of the script run to 100 iterations without a kill."""
    out = tmp_path_factory.mktemp("straight_run")
    _run(out, 100)
    return LogReport.read(out / "log.jsonl")


@pytest.mark.slow
def test_sigkill_and_autoload_resume_leave_each_iteration_once(
    tmp_path: Path, straight_run: list[dict[str, Any]]
) -> None:
    # Snapshots every 50 iterations: the kill at 70 leaves entries 51-70 after the newest.
    _run(tmp_path, 100, kill_at=70)
    _torn(tmp_path / "log.jsonl")
    _run(tmp_path, 100)
    got = LogReport.read(tmp_path / "log.jsonl")
    assert [e["iteration"] for e in got] == list(range(1, 101))
    assert _without_time(got) == _without_time(straight_run)


@pytest.mark.slow
def test_a_rerun_that_trains_longer_appends_without_repeating_entries(
    tmp_path: Path, straight_run: list[dict[str, Any]]
) -> None:
    _run(tmp_path, 80)  # finished; its newest snapshot is at iteration 50
    _run(tmp_path, 100)  # resumes from it and trains on to 100
    got = LogReport.read(tmp_path / "log.jsonl")
    assert [e["iteration"] for e in got] == list(range(1, 101))
    assert _without_time(got) == _without_time(straight_run)
