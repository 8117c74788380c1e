"""A log entry's write costs the same however long the log is (no timing: work is counted).

Each entry after the first is added to the file (appended; for JSON written into the array
before its closing bracket) instead of rewriting the file, and appends are ``fsync``-ed at
most every ``Writer.append_sync_interval`` seconds and at ``finalize``.
"""

from __future__ import annotations

import itertools
import json
import os
from pathlib import Path
from typing import Any

import pytest
from test_log_report import _manager, _train

from ppe_core.training.extensions._log_report import LogReport
from ppe_core.writing import (
    ProcessQueueWriter,
    SimpleWriter,
    ThreadQueueWriter,
    ThreadWriter,
    _writer_base,
)

FORMATS = {"log": "json", "log.jsonl": "json-lines", "log.csv": "csv", "log.yaml": "yaml"}


class CountingWriter(SimpleWriter):
    """A SimpleWriter recording each call: (entries given, append) and the file's size after."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[int, bool, int]] = []

    def __call__(self, filename: str, out_dir: str, target: Any, **kwargs: Any) -> None:
        super().__call__(filename, out_dir, target, **kwargs)
        size = os.path.getsize(os.path.join(out_dir, filename))
        self.calls.append((len(target), kwargs["append"], size))


def _entry_bytes(entry: dict[str, Any], fmt: str) -> int:
    """What adding ``entry`` to a file of the format grows it by."""
    if fmt == "json":
        return len(",\n" + json.dumps([entry], indent=4)[2:]) - 2  # replaces the "\n]"
    if fmt == "json-lines":
        return len(json.dumps(entry)) + 1
    if fmt == "csv":
        return len(",".join(repr(v) for v in entry.values())) + 1
    import yaml

    return len(yaml.safe_dump([entry]))


@pytest.mark.parametrize("filename", list(FORMATS))
def test_each_entry_after_the_first_writes_only_itself(
    tmp_path: Path, filename: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    if FORMATS[filename] == "yaml":
        pytest.importorskip("yaml")
    renames: list[str] = []
    real_replace = os.replace

    def counting_replace(src: str, dst: str) -> None:
        renames.append(dst)
        real_replace(src, dst)

    monkeypatch.setattr(_writer_base.os, "replace", counting_replace)
    writer = CountingWriter()
    log_report = LogReport(trigger=(1, "iteration"), filename=filename, writer=writer)
    manager = _manager(tmp_path, [log_report], max_epochs=50)  # 200 entries
    _train(manager)

    assert len(log_report.log) == 200
    # One atomic replace (the first entry), then appends of one entry each.
    assert len(renames) == 1
    assert [(n, append) for n, append, _ in writer.calls] == [(1, False)] + [(1, True)] * 199
    sizes = [size for _, _, size in writer.calls]
    growth = [after - before for before, after in itertools.pairwise(sizes)]
    fmt = FORMATS[filename]
    assert growth == [_entry_bytes(entry, fmt) for entry in log_report.log[1:]]
    # And the file is what a whole rewrite would have written.
    assert LogReport.read(tmp_path / filename) == log_report.log
    if fmt == "json":
        assert (tmp_path / filename).read_text() == json.dumps(log_report.log, indent=4)


def test_a_csv_header_is_rewritten_only_when_the_key_set_grows(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from test_log_report_csv import _late_key

    renames: list[str] = []
    real_replace = os.replace
    monkeypatch.setattr(
        _writer_base.os, "replace", lambda s, d: (renames.append(d), real_replace(s, d))
    )
    writer = CountingWriter()
    log_report = LogReport(trigger=(1, "iteration"), filename="log.csv", writer=writer)
    _train(_manager(tmp_path, [_late_key(20), log_report], max_epochs=25))  # 100 entries

    assert len(renames) == 2  # the first entry, and the first with late/value
    rewrites = [i for i, (n, append, _) in enumerate(writer.calls) if not append]
    assert rewrites == [0, 19]
    assert writer.calls[19][0] == 20  # the whole log, under the wider header
    assert LogReport.read(tmp_path / "log.csv") == log_report.log


@pytest.mark.parametrize("filename", ["log", "log.csv"])
def test_a_filename_template_rewrites_each_new_file_whole(tmp_path: Path, filename: str) -> None:
    log_report = LogReport(
        trigger=(2, "iteration"), filename=filename + "_{epoch}", format=FORMATS[filename]
    )
    _train(_manager(tmp_path, [log_report]))
    for epoch in (1, 2, 3):
        entries = LogReport.read(tmp_path / f"{filename}_{epoch}", format=FORMATS[filename])
        assert entries == [e for e in log_report.log if e["epoch"] <= epoch]


def test_a_writer_that_is_not_a_writer_object_gets_the_whole_log(tmp_path: Path) -> None:
    """PPE's protocol for custom writers (TensorBoardWriter, user objects) is kept."""
    calls: list[tuple[int, bool]] = []

    def custom(filename: str, out_dir: str, target: Any, *, savefun: Any, append: bool) -> None:
        calls.append((len(target), append))

    _train(_manager(tmp_path, [LogReport(trigger=(4, "iteration"), writer=custom)]))
    assert calls == [(1, False), (2, False), (3, False)]


@pytest.mark.parametrize("kind", ["thread-queue", "thread", "process-queue"])
@pytest.mark.parametrize("filename", ["log", "log.csv"])
def test_background_writers_extend_the_file_in_order(
    tmp_path: Path, kind: str, filename: str
) -> None:
    writer: Any = {
        "thread-queue": lambda: ThreadQueueWriter(out_dir=str(tmp_path)),
        "thread": lambda: ThreadWriter(out_dir=str(tmp_path)),
        "process-queue": lambda: ProcessQueueWriter(out_dir=str(tmp_path), mp_context="fork"),
    }[kind]()
    log_report = LogReport(trigger=(1, "iteration"), filename=filename)
    _train(_manager(tmp_path, [log_report], writer=writer))  # finalizes the writer
    assert LogReport.read(tmp_path / filename) == log_report.log


# --- fsync policy ------------------------------------------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    """The writers' clock, frozen until a test moves it."""
    frozen = Clock()
    monkeypatch.setattr(_writer_base.time, "monotonic", frozen)
    return frozen


@pytest.fixture
def fsyncs(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The descriptors ``os.fsync`` is called with, in order."""
    synced: list[int] = []
    real_fsync = os.fsync

    def counting_fsync(fd: int) -> None:
        synced.append(fd)
        real_fsync(fd)

    monkeypatch.setattr(_writer_base.os, "fsync", counting_fsync)
    return synced


def test_appends_are_synced_at_most_every_interval_and_at_finalize(
    tmp_path: Path, clock: Clock, fsyncs: list[int]
) -> None:
    writer = SimpleWriter()
    log_report = LogReport(trigger=(1, "iteration"), filename="log.jsonl", writer=writer)
    manager = _manager(tmp_path, [log_report], max_epochs=10)

    _train(manager, iterations=1)  # the atomic first write: file and directory
    assert len(fsyncs) == 2
    _train(manager, iterations=20)  # within the interval: flushed to the OS, not synced
    assert len(fsyncs) == 2
    assert len((tmp_path / "log.jsonl").read_text().splitlines()) == 21  # all in the file
    clock.now += writer.append_sync_interval
    _train(manager, iterations=1)  # the first append once the interval passed syncs
    assert len(fsyncs) == 3
    _train(manager, iterations=5)
    assert len(fsyncs) == 3
    writer.finalize()  # syncs what was appended since
    assert len(fsyncs) == 4


def test_a_zero_interval_syncs_every_append(tmp_path: Path, fsyncs: list[int]) -> None:
    writer = SimpleWriter()
    writer.append_sync_interval = 0.0
    manager = _manager(tmp_path, [LogReport(trigger=(1, "iteration"), writer=writer)])
    _train(manager, iterations=11)
    assert len(fsyncs) == 2 + 10


def test_a_queue_writer_syncs_its_appends_when_finalized(
    tmp_path: Path, clock: Clock, fsyncs: list[int]
) -> None:
    writer = ThreadQueueWriter(out_dir=str(tmp_path))
    manager = _manager(
        tmp_path, [LogReport(trigger=(1, "iteration"), filename="log.csv")], writer=writer
    )
    _train(manager, iterations=10)
    writer.finalize()
    assert len(fsyncs) == 3  # first write (file, directory), then the appends once, at the end


# --- a torn last entry -------------------------------------------------------------------------


@pytest.mark.parametrize("filename", ["log", "log.jsonl", "log.csv"])
@pytest.mark.parametrize("cut", [1, 5, 30])
def test_a_torn_last_entry_is_dropped_by_read_and_by_the_resumed_run(
    tmp_path: Path, filename: str, cut: int
) -> None:
    first = _manager(tmp_path, [LogReport(trigger=(1, "iteration"), filename=filename)])
    _train(first, iterations=6)
    snapshot = first.state_dict()
    _train(first, iterations=2)
    path = tmp_path / filename
    whole = path.read_bytes()
    path.write_bytes(whole[:-cut])  # what a kill in the middle of entry 8's write leaves

    # Entry 8 is dropped, unless the cut took only the JSON array's "\n]" (entry 8 is whole).
    kept = 8 if filename == "log" and cut == 1 else 7
    assert [e["iteration"] for e in LogReport.read(path)] == list(range(1, kept + 1))

    log_report = LogReport(trigger=(1, "iteration"), filename=filename)
    resumed = _manager(tmp_path, [log_report])
    resumed.load_state_dict(snapshot)
    _train(resumed)
    assert [e["iteration"] for e in LogReport.read(path)] == list(range(1, 13))
    assert LogReport.read(path) == log_report.log
    if filename == "log":
        assert json.loads(path.read_text()) == log_report.log


def test_read_refuses_a_file_damaged_before_its_end(tmp_path: Path) -> None:
    (tmp_path / "log.jsonl").write_text('{"iteration": 1}\n{"iter\n{"iteration": 3}\n')
    with pytest.raises(ValueError):
        LogReport.read(tmp_path / "log.jsonl")
    (tmp_path / "log").write_text("not json")
    with pytest.raises(ValueError, match="not a JSON log"):
        LogReport.read(tmp_path / "log")
