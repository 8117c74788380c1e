"""LogReport's CSV log: one row per entry, a header that grows, resume and a real SIGKILL."""

from __future__ import annotations

import csv
import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from ppe_extensions._log_report import LogReport
from test_log_report import _manager, _train

from ppe_core.errors import ConfigurationError
from ppe_core.reporting import report
from ppe_core.training import PRIORITY_WRITER, make_extension
from ppe_core.writing import ThreadQueueWriter

SCRIPT = Path(__file__).parent / "scripts" / "logging_training.py"
ITERATIONS = 400


def _rows(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def _late_key(first: int) -> Any:
    """An extension reporting ``late/value`` from iteration ``first`` on (a key that appears)."""

    @make_extension(trigger=(1, "iteration"), priority=PRIORITY_WRITER)
    def late(manager: Any) -> None:
        if manager.iteration >= first:
            report({"late/value": float(manager.iteration)})

    return late


def test_csv_is_inferred_from_the_suffix_and_holds_one_row_per_entry(tmp_path: Path) -> None:
    log_report = LogReport(trigger=(2, "iteration"), filename="log.csv")
    _train(_manager(tmp_path, [log_report]))

    rows = _rows(tmp_path / "log.csv")
    assert list(rows[0]) == ["epoch", "iteration", "train/loss", "elapsed_time"]  # epoch first
    assert [int(r["iteration"]) for r in rows] == [e["iteration"] for e in log_report.log]
    # Floats are written with repr: they read back exactly.
    assert [float(r["train/loss"]) for r in rows] == [e["train/loss"] for e in log_report.log]
    assert LogReport.read(tmp_path / "log.csv") == log_report.log


def test_a_new_key_widens_the_header_and_leaves_earlier_cells_empty(tmp_path: Path) -> None:
    log_report = LogReport(trigger=(1, "iteration"), format="csv", filename="metrics")
    _train(_manager(tmp_path, [_late_key(5), log_report]))

    rows = _rows(tmp_path / "metrics")
    assert list(rows[0])[:2] == ["epoch", "iteration"]  # kept first by the widened header
    assert list(rows[0])[-1] == "late/value"
    assert [r["late/value"] for r in rows[:4]] == ["", "", "", ""]
    assert [float(r["late/value"]) for r in rows[4:]] == [float(i) for i in range(5, 13)]
    assert LogReport.read(tmp_path / "metrics", format="csv") == log_report.log


def test_pandas_reads_the_csv_log(tmp_path: Path) -> None:
    pandas = pytest.importorskip("pandas")
    log_report = LogReport(trigger=(1, "iteration"), filename="log.csv")
    _train(_manager(tmp_path, [_late_key(5), log_report]))

    frame = pandas.read_csv(tmp_path / "log.csv")
    assert list(frame["iteration"]) == list(range(1, 13))
    assert frame["late/value"].isna().sum() == 4
    assert list(frame["train/loss"]) == [e["train/loss"] for e in log_report.log]


def test_csv_through_a_background_writer(tmp_path: Path) -> None:
    log_report = LogReport(trigger=(1, "iteration"), filename="log.csv")
    writer = ThreadQueueWriter(out_dir=str(tmp_path))
    _train(_manager(tmp_path, [_late_key(3), log_report], writer=writer))  # finalizes it
    assert LogReport.read(tmp_path / "log.csv") == log_report.log
    assert len(_rows(tmp_path / "log.csv")) == 12


def test_csv_cannot_append_to_an_earlier_runs_file() -> None:
    with pytest.raises(ConfigurationError, match="cannot append to a 'csv' log"):
        LogReport(filename="log.csv", append=True)


def test_resume_continues_the_csv_without_lost_or_repeated_rows(tmp_path: Path) -> None:
    reference = LogReport(trigger=(1, "iteration"), filename="log.csv")
    _train(_manager(tmp_path / "reference", [_late_key(8), reference]))

    first = _manager(
        tmp_path / "run", [_late_key(8), LogReport(trigger=(1, "iteration"), filename="log.csv")]
    )
    _train(first, iterations=6)
    torch.save(first.state_dict(), tmp_path / "snapshot")
    _train(first, iterations=3)  # rows past the snapshot, as a killed run leaves them

    resumed_report = LogReport(trigger=(1, "iteration"), filename="log.csv")
    resumed = _manager(tmp_path / "run", [_late_key(8), resumed_report])
    resumed.load_state_dict(torch.load(tmp_path / "snapshot", weights_only=True))
    _train(resumed)

    rows = _rows(tmp_path / "run" / "log.csv")
    assert [int(r["iteration"]) for r in rows] == list(range(1, 13))
    got = LogReport.read(tmp_path / "run" / "log.csv")
    assert got == resumed_report.log
    assert [e["train/loss"] for e in got] == pytest.approx(
        [e["train/loss"] for e in reference.log], rel=1e-6
    )


# --- a real SIGKILL ---------------------------------------------------------------------------


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PPE_")}
    env["OMP_NUM_THREADS"] = "1"
    return env


def _run(out: Path, filename: str, kill_at: int | None) -> int:
    """Runs the script; SIGKILLs it once it printed ``kill_at``. Returns the last printed."""
    proc = subprocess.Popen(
        [sys.executable, str(SCRIPT), str(out), filename, "--iterations", str(ITERATIONS)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=_env(),
    )
    assert proc.stdout is not None and proc.stderr is not None
    seen = -1
    deadline = time.monotonic() + 300
    for line in proc.stdout:
        if line.startswith("iteration "):
            seen = int(line.split()[1])
            if kill_at is not None and seen >= kill_at:
                os.kill(proc.pid, signal.SIGKILL)  # wherever it is: often inside a write
                break
        assert time.monotonic() < deadline
    proc.wait(timeout=120)
    errors = proc.stderr.read()
    proc.stdout.close()
    proc.stderr.close()
    if kill_at is None:
        assert proc.returncode == 0, errors
    else:
        assert proc.returncode == -signal.SIGKILL, errors
    return seen


def _serialized(entries: list[dict[str, Any]], fmt: str) -> str:
    if fmt == "json":
        return json.dumps(entries, indent=4)
    if fmt == "json-lines":
        return "".join(json.dumps(e) + "\n" for e in entries)
    columns = list(dict.fromkeys(k for e in entries for k in e))
    lines = [",".join(columns)]
    lines += [",".join("" if e.get(c) is None else repr(e[c]) for c in columns) for e in entries]
    return "".join(line + "\n" for line in lines)


def _assert_only_the_last_entry_may_be_torn(path: Path, fmt: str, printed: int) -> None:
    text = path.read_text()
    entries = LogReport.read(path)
    iterations = [e["iteration"] for e in entries]
    # Nothing written before the kill is lost: the entry of every printed iteration is there.
    assert iterations == list(range(1, len(entries) + 1))
    assert len(entries) >= printed
    whole = _serialized(entries, fmt)
    if fmt == "json":
        # The array is whole, or it lacks its end (the kill tore the write of the next entry).
        assert text == whole or text.startswith(whole[:-2]), text[-300:]
    else:
        assert text.startswith(whole) and "\n" not in text[len(whole) :], text[-300:]


@pytest.mark.slow
@pytest.mark.parametrize("filename", ["log.csv", "log", "log.jsonl"])
def test_sigkill_mid_run_loses_nothing_written_and_the_resumed_file_is_whole(
    tmp_path: Path, filename: str
) -> None:
    fmt = {"log.csv": "csv", "log": "json", "log.jsonl": "json-lines"}[filename]
    rng = random.Random(f"{filename}-25")
    for kill_at in sorted(rng.sample(range(60, ITERATIONS - 40), 2)):
        printed = _run(tmp_path, filename, kill_at)
        _assert_only_the_last_entry_may_be_torn(tmp_path / filename, fmt, printed)
    _run(tmp_path, filename, None)

    text = (tmp_path / filename).read_text()
    entries = LogReport.read(tmp_path / filename)
    assert [e["iteration"] for e in entries] == list(range(1, ITERATIONS + 1))
    assert text == _serialized(entries, fmt)  # exactly one whole entry per iteration
    if fmt == "csv":
        rows = _rows(tmp_path / filename)
        assert list(rows[0]) == ["epoch", "iteration", "train/loss", "elapsed_time", "late/value"]
        assert [int(r["iteration"]) for r in rows] == list(range(1, ITERATIONS + 1))
