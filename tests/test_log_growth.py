"""A log entry's write costs the same however long the log is (no timing: work is counted).

Each entry after the first is added to the file (appended; for JSON written into the array
before its closing bracket) instead of rewriting the file, and appends are ``fsync``-ed at
most every ``Writer.append_sync_interval`` seconds and at ``finalize``.
"""

from __future__ import annotations

import errno
import itertools
import json
import os
import random
from pathlib import Path
from typing import Any

import pytest
from ppe_extensions._log_report import LogReport, LogSaver
from test_log_report import _manager, _train

from ppe_core.errors import DiskFullError
from ppe_core.training._run_lock import RUN_LOCK_FILENAME
from ppe_core.writing import (
    ProcessQueueWriter,
    SimpleWriter,
    ThreadQueueWriter,
    ThreadWriter,
    Writer,
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
    if fmt == "yaml":
        import yaml

        assert (tmp_path / filename).read_text() == yaml.safe_dump(log_report.log)


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


# --- the per-entry append path -----------------------------------------------------------------


@pytest.mark.parametrize(
    "entries",
    [
        [],
        [{"train/loss": 0.1, "epoch": 0, "iteration": 1, "elapsed_time": 1.5e-05}],
        [{"a": float("nan"), "b": float("inf"), "c": -float("inf"), "d": -0.0, "e": 10**30}],
        [{"text": 'quote " newline \n unicode é \u2028', "flag": True, "none": None}, {"x": 1}],
        [{"nested": {"a": [1, 2.5]}, "x": 1}, {"y": 2}],  # not flat: json.dumps itself
        [{}, {"x": 1}],  # an empty entry
        [{1: 2.0}],  # a key that is not text
    ],
)
def test_json_log_text_is_json_dumps_with_indent_byte_for_byte(
    tmp_path: Path, entries: list[dict[Any, Any]]
) -> None:
    from ppe_extensions._log_formats import extend_json_array, json_array_text

    assert json_array_text(entries) == json.dumps(entries, indent=4)
    # Extended one entry at a time through the writer, the file is the whole log's dumps.
    writer = SimpleWriter()
    saver = LogReport(filename="log")._extender
    for index, entry in enumerate(entries):
        writer("log", str(tmp_path), [entry], savefun=saver, append=True)
        assert (tmp_path / "log").read_text() == json.dumps(entries[: index + 1], indent=4)
    writer.finalize()
    if len(entries) > 1:  # several entries in one call
        with open(tmp_path / "more", "ab") as file_obj:
            extend_json_array(entries, file_obj)
        assert (tmp_path / "more").read_text() == json.dumps(entries, indent=4)


def _random_entries(
    *,
    seed: int,
    numbers: list[Any],
    keys: list[str],
    suffixes: list[str],
    width: int,
    exponents: int,
) -> list[dict[str, Any]]:
    """2,000 entries of 1 to ``width`` keys (``keys`` + a suffix): half picked from
    ``numbers`` (a tenth from non-numbers: bools, None, strings, nan, inf, a huge int), half
    random floats scaled by 10**(-exponents..exponents)."""

    others = [True, None, "x%s", float("nan"), float("inf"), 10**400]
    rng = random.Random(seed)
    entries = []
    for _ in range(2_000):
        entry: dict[str, Any] = {}
        for _ in range(rng.randint(1, width)):
            pool = others if rng.random() < 0.1 else numbers
            value = (
                rng.choice(pool)
                if rng.random() < 0.5
                else rng.random() * 10.0 ** rng.randint(-exponents, exponents)
            )
            entry[rng.choice(keys) + rng.choice(suffixes)] = value
        entries.append(entry)
    return entries


def test_number_entries_skip_the_json_encoder_and_keep_its_text(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Entries of finite floats and ints (LogReport's) are formatted from a template of their
    keys, encoded once; the text is still json.dumps' own, byte for byte."""
    import sys

    from ppe_extensions import _log_formats

    entries = _random_entries(
        seed=25,
        numbers=[0.1, -0.0, 1e22, 5e-324, 1.7976931348623157e308, 3, -7, 10**30],
        keys=["train/loss", "a%b", 'q"uote', "\u00e9\n", "%r"],
        suffixes=["0", "1", "2"],
        width=5,
        exponents=9,
    )
    expected = [(json.dumps(e) + "\n", json.dumps([e], indent=4)[2:-2]) for e in entries]
    encoded: list[dict[str, Any]] = []
    for name in ("_encode_line", "_encode_indented"):
        real = getattr(_log_formats, name)

        def counting(entry: Any, level: int, real: Any = real) -> Any:
            encoded.append(entry)
            return real(entry, level)

        monkeypatch.setattr(_log_formats, name, counting)

    got = [(_log_formats.json_line(e), _log_formats._json_entry_text(e)) for e in entries]
    assert got == expected
    # What a writer's appender writes to add the entry to an array file: the same element.
    chunks = [_log_formats.json_entry_chunk(e, 100) for e in entries]
    assert chunks == [(98, f",\n{element}\n]".encode()) for _, element in expected]
    assert _log_formats.json_entry_chunk(entries[0], 2) == (0, f"[\n{expected[0][1]}\n]".encode())

    def numbers_only(entry: dict[str, Any]) -> bool:
        return all(
            v.__class__ in (float, int) and abs(v) <= sys.float_info.max for v in entry.values()
        )

    assert any(numbers_only(e) for e in entries)
    assert encoded and not any(numbers_only(e) for e in encoded)


def test_number_entries_skip_yamls_emitter_and_keep_its_text(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A YAML log's per-iteration item of finite floats and ints comes from a template of its
    keys (checked once against PyYAML's dump), byte for byte ``yaml.safe_dump([entry])``;
    keys PyYAML quotes or writes in another style, and other values, keep PyYAML's emitter."""

    yaml = pytest.importorskip("yaml")
    from ppe_extensions import _log_formats

    entries = _random_entries(
        seed=22,
        numbers=[0.1, -0.0, 1e17, 1e16, 1e22, 5e-324, 1e-05, 3, -7, 10**30, 0, 1.0],
        keys=["train/loss", "a%b", "1", "true", "null", "- x", "a: b", "#c", "k" * 130, "", "~"],
        suffixes=["", "0"],
        width=6,
        exponents=30,
    )
    pairs = [(entry, _log_formats.yaml_number_item(entry)) for entry in entries]
    fast = [(text, yaml.safe_dump([entry])) for entry, text in pairs if text is not None]
    assert [text for text, _ in fast] == [dumped for _, dumped in fast]
    assert len(fast) > 1_000  # most take the template
    assert all(text is None for entry, text in pairs if None in entry.values())

    # A per-iteration YAML log written through the template: PyYAML dumps the first write and
    # the template, not every entry, and the file is what one dump of the whole log writes.
    dumps: list[Any] = []
    real_dump = yaml.safe_dump

    def counting_dump(data: Any, *args: Any, **kwargs: Any) -> Any:
        dumps.append(data)
        return real_dump(data, *args, **kwargs)

    monkeypatch.setattr(yaml, "safe_dump", counting_dump)
    _log_formats._YAML_TEMPLATES.clear()
    log_report = LogReport(trigger=(1, "iteration"), filename="log.yaml")
    _train(_manager(tmp_path, [log_report], max_epochs=10))  # 40 entries
    assert len(log_report.log) == 40
    assert (tmp_path / "log.yaml").read_text() == real_dump(log_report.log)
    assert len(dumps) <= 3


def test_json_text_without_the_c_encoder_is_the_same(monkeypatch: pytest.MonkeyPatch) -> None:
    from ppe_extensions import _log_formats

    entry = {"train/loss": 0.1, "text": "é\n", "flag": False, "none": None, "n": 10**30}
    with_c = _log_formats._json_encoder(",\n        ")(entry, 0)
    monkeypatch.setattr(json.encoder, "c_make_encoder", None)
    without_c = _log_formats._json_encoder(",\n        ")(entry, 0)
    assert "".join(with_c) == "".join(without_c)
    assert "".join(without_c) == json.dumps(entry, separators=(",\n        ", ": "))


def test_a_csv_row_of_numbers_is_what_the_csv_module_writes() -> None:
    import csv
    import io

    from ppe_extensions._log_formats import csv_number_row

    entry = {"a": 0.1, "b": -3, "c": float("nan"), "d": float("inf"), "e": 1e22, "f": -0.0}
    buffer = io.StringIO()
    csv.writer(buffer, lineterminator="\n").writerow(list(entry.values()))
    assert csv_number_row(entry, list(entry)) == buffer.getvalue()
    # Text (which may need quoting), an empty cell and bools are left to the csv module.
    assert csv_number_row({"a": "x,y"}, ["a"]) is None
    assert csv_number_row({"a": 1.0}, ["a", "b"]) is None
    assert csv_number_row({"a": True}, ["a"]) is None


def _kept_handle(writer: SimpleWriter, path: Path) -> Any:
    return writer._append_files.files[str(path)].file


@pytest.mark.skipif(os.name != "posix", reason="O_APPEND is read with fcntl")
def test_the_json_log_is_extended_in_place_through_a_handle_without_o_append(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import fcntl

    from ppe_extensions import _log_formats

    writer = SimpleWriter()
    json_log = LogReport(trigger=(1, "iteration"), filename="log", writer=writer)
    lines_log = LogReport(trigger=(1, "iteration"), filename="log.jsonl", writer=writer)
    manager = _manager(tmp_path, [json_log, lines_log], max_epochs=10)
    _train(manager, iterations=2)  # the first write replaces the file; the second extends
    # With the writer's positional handle the extension is one pwrite: no flag to clear.
    monkeypatch.setattr(_log_formats, "fcntl", None)
    _train(manager, iterations=5)

    json_handle = _kept_handle(writer, tmp_path / "log")
    assert json_handle.mode == "wb"
    assert not fcntl.fcntl(json_handle.fileno(), fcntl.F_GETFL) & os.O_APPEND
    lines_handle = _kept_handle(writer, tmp_path / "log.jsonl")
    assert lines_handle.mode == "ab"
    assert fcntl.fcntl(lines_handle.fileno(), fcntl.F_GETFL) & os.O_APPEND
    assert (tmp_path / "log").read_text() == json.dumps(json_log.log, indent=4)
    assert LogReport.read(tmp_path / "log.jsonl") == lines_log.log
    monkeypatch.undo()
    writer.finalize()
    # A handle opened for appending (a writer of another kind) still works: flag cleared
    # around the write and restored.
    extra = {"iteration": 99, "epoch": 0, "elapsed_time": 1.0}
    with open(tmp_path / "log", "ab") as appending:
        _log_formats.extend_json_array([extra], appending)
        assert fcntl.fcntl(appending.fileno(), fcntl.F_GETFL) & os.O_APPEND
    assert (tmp_path / "log").read_text() == json.dumps([*json_log.log, extra], indent=4)


@pytest.fixture
def path_stats(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The paths the writers ``os.stat``, in order, but the run lock's: its check (one stat of
    the lock file) runs at the same points, each time a writer looks at a path, and
    tests/test_run_lock_damage.py tests it."""
    paths: list[str] = []
    real_stat = os.stat

    def counting_stat(path: Any, *args: Any, **kwargs: Any) -> os.stat_result:
        if os.path.basename(os.fspath(path)) != RUN_LOCK_FILENAME:
            paths.append(os.fspath(path))
        return real_stat(path, *args, **kwargs)

    monkeypatch.setattr(_writer_base.os, "stat", counting_stat)
    return paths


@pytest.mark.parametrize("filename", ["log", "log.jsonl", "log.csv"])
def test_a_log_file_replaced_or_removed_meanwhile_is_rebuilt_within_the_sync_interval(
    tmp_path: Path, filename: str, clock: Clock, path_stats: list[str]
) -> None:
    writer = SimpleWriter()
    log_report = LogReport(trigger=(1, "iteration"), filename=filename, writer=writer)
    manager = _manager(tmp_path, [log_report], max_epochs=10)
    path = tmp_path / filename
    _train(manager, iterations=3)
    kept = _kept_handle(writer, path)

    # Replaced by an older copy (a copy renamed over it, as a sync tool or another writer's
    # save does). Within the sync interval the path is not looked at: the entries go to the
    # file the handle has open, which no longer has a name.
    stale = path.read_bytes()
    (tmp_path / "copy").write_bytes(stale)
    os.replace(tmp_path / "copy", path)
    path_stats.clear()
    _train(manager, iterations=2)
    assert path_stats == []  # no system call per entry but the write
    assert path.read_bytes() == stale
    # The first entry once the interval passed checks the path, finds another file there and
    # writes the log whole: every entry, those of the interval included.
    clock.now += writer.append_sync_interval
    _train(manager, iterations=1)
    assert path_stats == [str(path)]
    assert writer.append_reopens == 1
    assert LogReport.read(path) == log_report.log
    if filename == "log":
        assert path.read_text() == json.dumps(log_report.log, indent=4)
    _train(manager, iterations=1)  # and the next entry is appended to the rebuilt file
    assert _kept_handle(writer, path) is not kept
    assert LogReport.read(path) == log_report.log

    # Removed: created again at the first entry after the interval, holding the whole log
    # (a CSV file with its header).
    os.remove(path)
    _train(manager, iterations=2)
    assert not path.exists()
    clock.now += writer.append_sync_interval
    _train(manager, iterations=1)
    assert writer.append_reopens == 2
    assert LogReport.read(path) == log_report.log
    assert len(log_report.log) == 10
    if filename == "log.csv":
        keys = [k for k in log_report.log[0] if k not in ("epoch", "iteration")]
        assert path.read_text().splitlines()[0] == ",".join(["epoch", "iteration", *keys])
    writer.finalize()


def test_a_writer_reopens_a_replaced_appended_file_once_the_sync_interval_passed(
    tmp_path: Path, clock: Clock, fsyncs: list[int]
) -> None:
    """A writer used directly (no LogReport to rebuild the file) continues the new file."""
    writer = SimpleWriter()
    saver = LogReport(filename="log.jsonl")._extender
    path = tmp_path / "log.jsonl"

    def append(iteration: int) -> None:
        writer("log.jsonl", str(tmp_path), [{"iteration": iteration}], savefun=saver, append=True)

    append(1)
    os.replace(path, tmp_path / "old.jsonl")  # moved away (a log rotation)
    append(2)  # within the interval: into the moved file
    clock.now += writer.append_sync_interval
    append(3)  # the path is checked: a new file
    append(4)
    synced = len(fsyncs)
    writer.finalize()
    assert len(fsyncs) == synced + 1  # the appended file, through its handle
    assert [e["iteration"] for e in LogReport.read(tmp_path / "old.jsonl")] == [1, 2]
    assert [e["iteration"] for e in LogReport.read(path)] == [3, 4]
    assert writer.append_reopens == 1


@pytest.mark.skipif(not hasattr(os, "fork"), reason="fork is POSIX")
def test_a_forked_child_does_not_append_through_its_parents_handles(tmp_path: Path) -> None:
    writer = SimpleWriter()
    saver = LogReport(filename="log.jsonl")._extender
    writer("log.jsonl", str(tmp_path), [{"iteration": 1}], savefun=saver, append=True)
    assert writer._append_files.files
    pid = os.fork()
    if pid == 0:  # the child: its handles are forgotten, an append opens its own
        try:
            ok = not writer._append_files.files
            writer("log.jsonl", str(tmp_path), [{"iteration": 2}], savefun=saver, append=True)
            ok = ok and _kept_handle(writer, tmp_path / "log.jsonl").fileno() >= 0
        finally:
            os._exit(0 if ok else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert writer._append_files.files  # the parent's are untouched
    writer("log.jsonl", str(tmp_path), [{"iteration": 3}], savefun=saver, append=True)
    writer.finalize()
    assert [e["iteration"] for e in LogReport.read(tmp_path / "log.jsonl")] == [1, 2, 3]


def test_a_subdirectory_removed_meanwhile_is_created_again(tmp_path: Path, clock: Clock) -> None:
    import shutil

    writer = SimpleWriter()
    saver = LogReport(filename="log.jsonl")._extender
    writer("sub/log.jsonl", str(tmp_path), [{"iteration": 1}], savefun=saver, append=True)
    shutil.rmtree(tmp_path / "sub")
    clock.now += writer.append_sync_interval  # the path is checked once per interval
    writer("sub/log.jsonl", str(tmp_path), [{"iteration": 2}], savefun=saver, append=True)
    writer.finalize()
    assert LogReport.read(tmp_path / "sub" / "log.jsonl") == [{"iteration": 2}]


# --- the appender's own writes -----------------------------------------------------------------
# A SimpleWriter's Appender writes an entry with one system call through the handle the writer
# keeps open, while the file is not due for its fsync; anything else (the sync due, a handle
# the writer closed, an entry the fast formatters leave to json/csv, a failed write, a forked
# child) goes through the writer. Either way the file is what a whole rewrite writes.


@pytest.fixture
def saves(monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """The ``append`` flag of every ``Writer.save``: the writes that went through the writer."""
    calls: list[bool] = []
    real_save = Writer.save

    def counting_save(self: Writer, *args: Any, **kwargs: Any) -> None:
        calls.append(args[4])
        real_save(self, *args, **kwargs)

    monkeypatch.setattr(Writer, "save", counting_save)
    return calls


def _assert_whole(path: Path, log: list[dict[str, Any]], fmt: str) -> None:
    """``path`` holds exactly what writing ``log`` whole writes."""
    assert LogReport.read(path, format=fmt) == log
    if fmt == "json":
        assert path.read_text() == json.dumps(log, indent=4)
    elif fmt == "json-lines":
        assert path.read_text() == "".join(json.dumps(entry) + "\n" for entry in log)
    elif fmt == "yaml":
        import yaml

        assert path.read_text() == yaml.safe_dump(log)


@pytest.mark.parametrize("filename", list(FORMATS))
def test_entries_within_the_sync_interval_are_written_without_the_writer(
    tmp_path: Path, filename: str, clock: Clock, saves: list[bool], fsyncs: list[int]
) -> None:
    fmt = FORMATS[filename]
    if fmt == "yaml":
        pytest.importorskip("yaml")
    writer = SimpleWriter()
    log_report = LogReport(trigger=(1, "iteration"), filename=filename, writer=writer)
    manager = _manager(tmp_path, [log_report], max_epochs=10)
    path = tmp_path / filename

    _train(manager, iterations=2)  # written whole, then one append opens the kept handle
    assert saves == [False, True]
    synced = len(fsyncs)
    for _ in range(10):  # one system call each, and the file is whole after every entry
        _train(manager, iterations=1)
        _assert_whole(path, log_report.log, fmt)
    assert saves == [False, True]
    assert len(fsyncs) == synced

    clock.now += writer.append_sync_interval  # the sync is due: through the writer, synced
    _train(manager, iterations=1)
    assert saves == [False, True, True]
    assert len(fsyncs) == synced + 1
    _train(manager, iterations=5)  # and the next entries are the appender's again
    assert saves == [False, True, True]
    _assert_whole(path, log_report.log, fmt)
    writer.finalize()  # the appender's entries are synced at finalize
    assert len(fsyncs) == synced + 2


def test_a_handle_the_writer_closed_sends_the_next_entry_through_the_writer(
    tmp_path: Path, clock: Clock, saves: list[bool]
) -> None:
    writer = SimpleWriter()
    log_report = LogReport(trigger=(1, "iteration"), filename="log", writer=writer)
    manager = _manager(tmp_path, [log_report], max_epochs=10)
    _train(manager, iterations=4)
    assert saves == [False, True]
    writer.finalize()  # closes the kept handles
    _train(manager, iterations=1)  # reopens the file through the writer
    assert saves == [False, True, True]
    _train(manager, iterations=3)
    assert saves == [False, True, True]
    _assert_whole(tmp_path / "log", log_report.log, "json")
    writer.finalize()


@pytest.mark.parametrize("filename", ["log", "log.csv"])
def test_entries_the_fast_formatters_decline_go_through_the_writer(
    tmp_path: Path, filename: str, clock: Clock, saves: list[bool]
) -> None:
    """JSON's nested values and CSV's text cells are written by ``json`` and ``csv``."""
    fmt = FORMATS[filename]
    odd = {"json": {"nested": [1, 2.5]}, "csv": 'text, "quoted"'}[fmt]

    def postprocess(entry: dict[str, Any]) -> None:
        entry["odd"] = odd if entry["iteration"] % 3 == 0 else 0

    writer = SimpleWriter()
    log_report = LogReport(
        trigger=(1, "iteration"), filename=filename, writer=writer, postprocess=postprocess
    )
    _train(_manager(tmp_path, [log_report], max_epochs=3))  # 12 entries
    # Written whole (1), opened by an append (2), then the writer only for iterations 3k.
    assert saves == [False, True, True, True, True, True]
    _assert_whole(tmp_path / filename, log_report.log, fmt)
    writer.finalize()


@pytest.mark.parametrize("filename", ["log", "log.jsonl"])
def test_a_failed_write_names_the_file_and_the_next_append_reopens_it(
    tmp_path: Path, filename: str, clock: Clock, monkeypatch: pytest.MonkeyPatch
) -> None:
    fmt = FORMATS[filename]
    path = tmp_path / filename
    writer = SimpleWriter()
    appender = writer.appender(filename, str(tmp_path), LogSaver(fmt, extend=True))
    assert appender([{"iteration": 1}])  # through the writer: it opens the handle
    kept = _kept_handle(writer, path)
    real_write, real_pwrite = os.write, os.pwrite

    def disk_full(fd: int, data: bytes, *offset: int) -> int:
        if fd == kept.fileno():
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real_pwrite(fd, data, *offset) if offset else real_write(fd, data)

    monkeypatch.setattr(_writer_base.os, "write", disk_full)
    monkeypatch.setattr(_writer_base.os, "pwrite", disk_full)
    with pytest.raises(DiskFullError) as info:
        appender([{"iteration": 2}])
    assert info.value.filename == str(path)
    assert filename in str(info.value)
    assert str(path) not in writer._append_files.files  # closed: the next append reopens
    monkeypatch.undo()
    assert appender([{"iteration": 3}])
    assert appender([{"iteration": 4}])
    writer.finalize()
    _assert_whole(path, [{"iteration": i} for i in (1, 3, 4)], fmt)


def test_post_save_hooks_run_after_every_append(tmp_path: Path, clock: Clock) -> None:
    writer = SimpleWriter()
    runs: list[int] = []
    writer._add_cleanup_hook(lambda: runs.append(1))
    log_report = LogReport(trigger=(1, "iteration"), filename="log.jsonl", writer=writer)
    _train(_manager(tmp_path, [log_report], max_epochs=2))
    assert len(runs) == len(log_report.log) == 8
    writer.finalize()


def test_writers_that_save_their_own_way_get_every_append(
    tmp_path: Path, clock: Clock, saves: list[bool]
) -> None:
    """A subclass with its own ``save``, and background writers, see each entry."""

    class OwnSave(SimpleWriter):
        def save(self, *args: Any, **kwargs: Any) -> None:
            super().save(*args, **kwargs)

    own = OwnSave()
    log_report = LogReport(trigger=(1, "iteration"), filename="log", writer=own)
    _train(_manager(tmp_path, [log_report], max_epochs=2))
    assert saves == [False] + [True] * 7  # the whole log once, then each entry
    _assert_whole(tmp_path / "log", log_report.log, "json")
    own.finalize()

    saves.clear()
    thread = ThreadWriter()
    log_report = LogReport(trigger=(1, "iteration"), filename="log2", writer=thread)
    _train(_manager(tmp_path, [log_report], max_epochs=2))
    thread.finalize()
    assert saves == [False] + [True] * 7
    _assert_whole(tmp_path / "log2", log_report.log, "json")


@pytest.mark.skipif(not hasattr(os, "fork"), reason="fork is POSIX")
def test_a_forked_child_appends_through_its_own_handle(tmp_path: Path, clock: Clock) -> None:
    writer = SimpleWriter()
    appender = writer.appender("log.jsonl", str(tmp_path), LogSaver("json-lines", extend=True))
    assert appender([{"iteration": 1}])
    assert appender([{"iteration": 2}])  # the appender's own write
    pid = os.fork()
    if pid == 0:  # the parent's handles are gone: the writer opens the child's
        try:
            ok = appender([{"iteration": 3}]) and bool(writer._append_files.files)
        finally:
            os._exit(0 if ok else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert appender([{"iteration": 4}])
    writer.finalize()
    assert [e["iteration"] for e in LogReport.read(tmp_path / "log.jsonl")] == [1, 2, 3, 4]
