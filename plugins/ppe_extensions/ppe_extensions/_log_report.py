"""``LogReport``: accumulates observations and writes their interval means to a log file."""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import IO, TYPE_CHECKING, Any

from ppe_core.distributed import group_world
from ppe_core.errors import ConfigurationError, OptionalDependencyError
from ppe_core.reporting import DictSummary
from ppe_core.training.extension import PRIORITY_READER, Extension
from ppe_core.training.triggers import DueCheck, EveryIteration, get_trigger
from ppe_core.writing import (
    Appender,
    OutputSample,
    SimpleWriter,
    Writer,
    WriterLike,
    log_output_files,
)
from ppe_extensions._keys import key_tuple
from ppe_extensions._log_formats import (
    csv_number_row,
    csv_text,
    entry_columns,
    extend_json_array,
    json_array_text,
    json_entry_chunk,
    json_line,
    line_entries,
    parse_entry,
    read_entries,
    yaml_number_item,
)

if TYPE_CHECKING:
    from ppe_core.training.extension import ManagerView
    from ppe_core.training.triggers import Trigger, TriggerLike

__all__ = ["LOG_FORMATS", "LOG_REPORT_FORMATS", "LogReport", "LogSaver", "LogWriter"]

#: The formats of :class:`LogSaver` that ProfileReport accepts (PPE's three).
LOG_FORMATS = ("json", "json-lines", "yaml")

#: The accepted values of ``LogReport(format=...)``: PPE's three and ``'csv'``.
LOG_REPORT_FORMATS = (*LOG_FORMATS, "csv")

# Filename suffix -> format, used when ``format`` is None.
# Entry listeners are added and removed on any thread; emitting reads them without it.
_LISTENERS_LOCK = threading.Lock()

_SUFFIX_FORMATS = {
    ".json": "json",
    ".jsonl": "json-lines",
    ".yaml": "yaml",
    ".yml": "yaml",
    ".csv": "csv",
}


#: What LogReport needs of a writer: ``ppe_core.writing`` writers, TensorBoardWriter, ...
LogWriter = WriterLike


def infer_format(filename: str) -> str:
    """The format of :data:`LOG_REPORT_FORMATS` that ``filename``'s suffix names; else 'json'."""
    return next(
        (fmt for suffix, fmt in _SUFFIX_FORMATS.items() if filename.endswith(suffix)), "json"
    )


def _checked_format(
    format: str | None, filename: str, caller: str, formats: Sequence[str] = LOG_REPORT_FORMATS
) -> str:
    """``format``, or when None the one ``filename``'s suffix names, checked for ``caller``
    (which accepts ``formats``)."""
    fmt = infer_format(filename) if format is None else format
    if fmt not in formats:
        suffixes = [suffix for suffix, named in _SUFFIX_FORMATS.items() if named in formats]
        raise ConfigurationError(
            f"{caller} format must be one of {list(formats)}, got {fmt!r}; pass one of them, "
            f"or leave format out and end the filename in one of {suffixes}"
        )
    if fmt == "yaml":
        _require_yaml(caller)
    return fmt


def _require_yaml(caller: str) -> None:
    """Refuses the 'yaml' format without PyYAML installed, before anything is logged."""
    if importlib.util.find_spec("yaml") is None:
        raise OptionalDependencyError(
            f"{caller}(format='yaml') needs PyYAML, which is not installed; run "
            "`pip install pyyaml`, or use format='json' or 'json-lines'"
        )


class LogSaver:
    """The ``savefun`` for a list of log entries in one of :data:`LOG_REPORT_FORMATS`.

    A module-level class so process-based writers can pickle it. ``'json'`` writes one JSON
    list; ``'json-lines'`` one object per line (appends stay valid); ``'yaml'`` a sequence
    (needs PyYAML; appended chunks concatenate into one longer sequence); ``'csv'`` a header
    row of ``columns`` (the keys of ``target`` in order of first appearance when None) and
    one row per entry, a key an entry lacks left empty.

    With ``extend=True`` the saver adds ``target`` to a file it wrote before (opened for
    appending by the writer): the same lines for json-lines and YAML, rows without the
    header for CSV, and for JSON the entries go into the array in place (see
    :func:`extend_json_array`), so each call costs what its entries cost, not the file.
    :meth:`append_chunk` gives the bytes of such a call, for a writer's
    :class:`~ppe_core.writing.Appender` to write them itself.
    """

    def __init__(
        self, fmt: str, columns: Sequence[str] | None = None, *, extend: bool = False
    ) -> None:
        self.fmt = fmt
        self.columns = None if columns is None else tuple(columns)
        self.extend = extend
        #: Tells the writer that this saver writes at offsets (the JSON array's end), so its
        #: appends get a handle opened without ``O_APPEND`` (see ``ppe_core.writing.Writer``).
        self.positional = fmt == "json" and extend

    def __call__(
        self, target: list[dict[str, Any]], file_obj: IO[bytes], size: int | None = None
    ) -> int | None:
        """Writes (or with ``extend`` adds) ``target`` into ``file_obj``.

        ``size`` is the file's size, which writers pass to a :attr:`positional` saver (the
        JSON extender); it is read from the file when None.

        Returns:
            For the :attr:`positional` saver, the file's size after the write (the writer
            keeps it for the next call); None otherwise.
        """
        if self.extend:
            if self.fmt == "json":
                return extend_json_array(target, file_obj, size)
            chunk = self.append_chunk(target, None)  # one entry the fast formatters write
            if chunk is not None:
                file_obj.write(chunk[1])
                return None
        if self.fmt == "json":
            text = json_array_text(target)
        elif self.fmt == "json-lines":
            text = "".join(json_line(entry) for entry in target)
        elif self.fmt == "csv":
            columns = entry_columns(target) if self.columns is None else self.columns
            text = csv_text(target, columns, header=not self.extend)
        else:
            yaml: Any = importlib.import_module("yaml")
            text = yaml.safe_dump(target) if target else ""
        file_obj.write(text.encode("utf-8"))
        return None

    def append_chunk(
        self, target: list[dict[str, Any]], size: int | None
    ) -> tuple[int | None, bytes] | None:
        """What calling this extending saver with one entry would write, as ``(offset,
        data)``, so that a writer's appender can write it itself (one system call).

        ``offset`` is where in the file of ``size`` bytes the JSON extender writes ``data``
        (over the array's closing bracket), and None for the other formats, whose ``data``
        goes to the end. None (the saver must be called) for a saver that does not extend,
        several entries, an entry the fast formatters leave to ``json``, ``csv`` or PyYAML,
        or a JSON file of unknown size.
        """
        if not self.extend or len(target) != 1:
            return None
        if self.positional:
            return None if size is None else json_entry_chunk(target[0], size)
        row = self._row(target[0])
        return None if row is None else (None, row.encode("utf-8"))

    def _row(self, entry: dict[str, Any]) -> str | None:
        """An extending saver's text for one entry of a json-lines, CSV (of known columns) or
        YAML log, where the fast formatters write it; None for the rest."""
        if self.fmt == "json-lines":
            return json_line(entry)
        if self.fmt == "csv":
            return None if self.columns is None else csv_number_row(entry, self.columns)
        if self.fmt == "yaml":
            return yaml_number_item(entry)
        return None


class LogReport(Extension):
    """Writes the mean of every reported value over each interval to a log file.

    The extension runs after every iteration, but all it does then is add the observation to
    a :class:`~ppe_core.reporting.DictSummary` (tensors stay on their device, nothing
    synchronizes) and compare the iteration with the precomputed next due iteration of its
    own ``trigger``. When that trigger fires, it computes the means (one device-to-host copy),
    adds ``epoch``, ``iteration`` and ``elapsed_time``, appends the entry to :attr:`log`,
    writes it through the manager's writer and starts a fresh summary.

    Writing an entry costs the same however long the log is. The first entry a LogReport
    writes (and the first after :meth:`load_state_dict`, and each entry whose filename
    differs from the previous one) replaces the file atomically with the whole log; every
    later entry is added to it: appended for json-lines, YAML and CSV, and for JSON written
    into the array in place, before its closing bracket. A resumed run therefore continues
    the same file with no entry lost or repeated (its first write drops what the killed run
    wrote after the snapshot). A CSV log's header holds the keys seen, in order of first
    appearance; an entry that brings a new key (rare: e.g. the first validation entry)
    rewrites the file with the wider header, the earlier rows' cell for it left empty. Each
    entry reaches the operating system before the call returns, so a killed process loses
    none written before it; the kill can tear only the entry being written, which
    :meth:`read` and a resumed run repair. Writers ``fsync`` appended files at most every
    :attr:`~ppe_core.writing.Writer.append_sync_interval` seconds (1 s), so a machine crash
    loses at most that interval's entries. A file replaced or removed under the writer is
    noticed at its next ``fsync`` (so within that interval, not per entry: the entries between
    go to the file the writer has open), and the log is then written whole again. Writers
    that are not
    :class:`~ppe_core.writing.Writer` objects (e.g. ``TensorBoardWriter``) receive the whole
    log at every entry with ``append=False``, as in PPE, and JSON through a writer on
    another file system (``fs=``) is rewritten whole.

    Args:
        keys: Names of the observed values to log; all values when None.
        trigger: When to emit an entry (anything ``get_trigger`` accepts); once per epoch by
            default. Distinct from the extension's own every-iteration trigger.
        postprocess: Called with each new entry (a dict) before it is stored and written; it
            may modify the entry in place.
        filename: Log file name under ``manager.out``; ``'log'`` when None. It may be a format
            string filled with the entry, e.g. ``'log_{iteration}'``.
        append: Keep what the file held before this run and append the new entries to it,
            instead of starting the file with this run's log; needs the ``'json-lines'`` or
            ``'yaml'`` format. Before its first append the file is repaired once: an entry a
            kill tore at its end is dropped, and after a resume so is what the killed run
            wrote after its snapshot (the snapshot counts the file's entries), so the file
            holds each entry once. Without a snapshot to resume, entries are added to what
            the file holds.
        format: ``'json'`` (a JSON list), ``'json-lines'``, ``'yaml'`` (needs PyYAML) or
            ``'csv'`` (readable by ``csv.DictReader`` and ``pandas.read_csv``). Inferred
            from the filename suffix (``.json``, ``.jsonl``, ``.yaml``/``.yml``, ``.csv``)
            when None; ``'json'`` otherwise.
        writer: Writer to save the file with; the manager's writer by default. It is
            finalized with the extension, as in PPE.

    Raises:
        ConfigurationError: ``format`` is unknown, or ``append=True`` with ``'json'`` or
            ``'csv'``.
        OptionalDependencyError: The ``'yaml'`` format without PyYAML installed.

    Example::

        manager.extend(LogReport(trigger=(100, "iteration"), filename="log.csv"))
    """

    priority = PRIORITY_READER

    def __init__(
        self,
        keys: Iterable[str] | None = None,
        trigger: TriggerLike = (1, "epoch"),
        postprocess: Callable[[dict[str, Any]], object] | None = None,
        filename: str | os.PathLike[str] | None = None,
        append: bool = False,
        format: str | None = None,
        writer: LogWriter | None = None,
    ) -> None:
        # A Path names the same file its str form does (templates included).
        filename = "log" if filename is None else os.fspath(filename)
        format = _checked_format(format, filename, "LogReport")
        if append and format in ("json", "csv"):
            what = "one JSON list" if format == "json" else "one header and its rows"
            raise ConfigurationError(
                f"LogReport cannot append to a {format!r} log of an earlier run (it is {what}); "
                "use format='json-lines' (e.g. filename='log.jsonl') or append=False (a "
                "resumed run continues its own file either way)"
            )
        # The extension itself runs every iteration to accumulate; `_trigger` decides output.
        self.trigger = EveryIteration()
        self._keys = None if keys is None else key_tuple(keys, "LogReport", "keys")
        self._trigger = get_trigger(trigger)
        self._postprocess = postprocess
        self._filename = filename
        self._static_filename = "{" not in filename and "}" not in filename
        self._append = append
        self._format = format
        self._writer = writer
        self._saver = LogSaver(format)
        self._extender = LogSaver(format, extend=True)
        self._summary = DictSummary()
        self._log: list[dict[str, Any]] = []
        # Entries already in the file (append mode writes only the rest).
        self._written = 0
        # The file this LogReport wrote the whole log into and extends since (None: the next
        # entry rewrites it), and, for CSV, the columns of its header.
        self._file: str | None = None
        self._columns: dict[str, None] = {}
        # Adds entries to the file through the writer that wrote it whole, if they can be
        # added to it (see _rewrite).
        self._appender: Appender | None = None
        self._due = DueCheck(self._trigger)
        # Append mode repairs the file once before its first append (see _prepare_append):
        # whether it did, how many entries the file held before this log's first one (None:
        # unknown), and what load_state_dict restored (None: nothing, a fresh run).
        self._prepared = False
        self._base: int | None = None
        self._restored: int | None = None
        self._restored_file_entries: int | None = None
        self._manager: ManagerView | None = None
        # Called with each new entry (trackers): a tuple, so no listener costs one empty loop.
        self._listeners: tuple[Callable[[dict[str, Any]], object], ...] = ()

    def initialize(self, manager: ManagerView) -> None:
        """Remembers the manager, whose output directory an appending log's snapshot state
        counts the file's entries in (see :meth:`state_dict`)."""
        self._manager = manager

    def __call__(self, manager: ManagerView) -> None:
        """Accumulates this iteration's observation; emits an entry when the trigger fires."""
        observation = manager.observation
        keys = self._keys
        if keys is None:
            self._summary.add(observation)
        else:
            self._summary.add({key: observation[key] for key in keys if key in observation})
        iteration = manager.iteration
        if iteration < self._due.due:  # the trigger cannot fire yet: no call on most steps
            return
        # Before training (call_before_training=True) an entry is always written, as in PPE.
        if iteration == 0 or self._due(manager):
            self._emit(manager)

    def _emit(self, manager: ManagerView) -> None:
        entry: dict[str, Any] = self._summary.compute_mean_floats()
        entry["epoch"] = manager.epoch
        entry["iteration"] = manager.iteration
        entry["elapsed_time"] = manager.elapsed_time
        if self._postprocess is not None:
            self._postprocess(entry)
        self._log.append(entry)
        self._summary = DictSummary()
        self._write(manager, entry)
        for listener in self._listeners:
            listener(entry)

    def _write(self, manager: ManagerView, entry: Mapping[str, Any]) -> None:
        writer: Any = self._writer if self._writer is not None else getattr(manager, "writer", None)
        if writer is None:
            writer = self._writer = SimpleWriter()
        # A name without a field is the common case; formatting it per entry costs a dict.
        filename = self._filename if self._static_filename else self._filename.format(**entry)
        appender = self._appender
        if (
            appender is not None
            and writer is appender.writer
            and filename == self._file
            and (self._format != "csv" or self._columns.keys() >= entry.keys())  # else: wider
        ):
            # Added to the file this LogReport wrote whole through this writer, which only
            # rank 0 does (decided then, so no rank check per entry).
            if not appender([entry]):
                # The writer found a file replaced or removed under it (it checks once per
                # sync interval): the log is written whole again, the entries appended to
                # the old file within that interval included.
                self._rewrite(writer, filename, manager.out)
        elif group_world()[1] == 0:
            # Under torch.distributed only rank 0 writes the file; every rank keeps the entries
            # (PrintReport, BestValue, ... read them) and its snapshots stay identical.
            if self._append:
                if not self._prepared:
                    self._prepare_append(writer, filename, manager.out)
                pending = self._log[self._written :]
                writer(filename, manager.out, pending, savefun=self._saver, append=True)
            else:
                self._rewrite(writer, filename, manager.out)
        self._written = len(self._log)

    def _prepare_append(self, writer: Any, filename: str, out: str) -> None:
        """Repairs the file this run appends to, once, before its first append.

        It drops an entry a kill tore at the file's end, and after a resume what the killed
        run wrote after its snapshot: the file keeps the entries the snapshot counted
        (``_file_entries`` of its state), or, for a state without that count (PPE's, or one
        saved before the file was looked at), those up to the newest restored entry it
        holds. Restored entries the file lacks (a background writer killed before it wrote
        them) are appended again. Only for a fixed filename on local files (a writer's
        ``writes_local_files``); others are appended to as they are.
        """
        self._prepared = True
        local = isinstance(writer, Writer) and writer.writes_local_files
        if not (local and self._static_filename):
            return
        path = os.path.join(out, filename)
        try:
            with open(path, "rb") as file_obj:
                data = file_obj.read()
        except FileNotFoundError:
            data = b""
        spans = line_entries(data, self._format)
        restored = self._restored or 0
        keep, missing = len(spans), 0
        if self._restored is not None:
            count = self._restored_file_entries
            if count is not None:
                keep = min(count, len(spans))
                missing = min(count - keep, restored)
            elif restored:
                keep, missing = self._newest_restored_entry(data, spans)
        end = spans[keep - 1][1] if keep else 0
        if end < len(data):
            os.truncate(path, end)
        self._base = max(keep - (restored - missing), 0)
        self._written = restored - missing

    def _newest_restored_entry(self, data: bytes, spans: list[tuple[int, int]]) -> tuple[int, int]:
        """How many of the file's entries to keep (through the newest restored entry found,
        searching from the end), and how many restored entries follow it (the file lacks)."""
        restored = self._log[: self._restored]
        index = {json.dumps(entry, sort_keys=True): i for i, entry in enumerate(restored)}
        for keep in range(len(spans), 0, -1):
            start, end = spans[keep - 1]
            found = index.get(
                json.dumps(parse_entry(data[start:end], self._format), sort_keys=True)
            )
            if found is not None:
                return keep, len(restored) - 1 - found
        return len(spans), len(restored)

    def _file_entries(self) -> int | None:
        """How many entries an appending log's file holds with this log's written: what a
        resumed run keeps of it. None where this process does not write the file."""
        manager = self._manager
        if not self._prepared and manager is not None and group_world()[1] == 0:
            # A snapshot before the first entry: the file is looked at (and repaired) now.
            writer = self._writer if self._writer is not None else getattr(manager, "writer", None)
            self._prepare_append(writer, self._filename, manager.out)
        return None if self._base is None else self._base + self._written

    def _rewrite(self, writer: Any, filename: str, out: str) -> None:
        """Replaces the file with the whole log; later entries are added to it."""
        if self._format == "csv":
            self._widen_csv_header()
        # A copy: background writers serialize it after this returns.
        writer(filename, out, list(self._log), savefun=self._saver, append=False)
        self._file = filename
        # Later entries are added to the file (for CSV, only those without a new key) unless
        # the writer is a custom one (PPE's protocol: it gets the whole log every time) or, for
        # JSON, which is edited in place, writes elsewhere than to local files. The writer's
        # appender writes most of them itself where the writer saves in this thread (see
        # ppe_core.writing.Appender), and says when the file was replaced.
        adds = isinstance(writer, Writer) and (self._format != "json" or writer.writes_local_files)
        self._appender = writer.appender(filename, out, self._extender) if adds else None

    def _widen_csv_header(self) -> None:
        """A CSV log's header: the keys of the whole log, in order of first appearance."""
        self._columns = dict.fromkeys(entry_columns(self._log))
        self._saver = LogSaver("csv", tuple(self._columns))
        self._extender = LogSaver("csv", tuple(self._columns), extend=True)

    def output_files(self, sample: OutputSample) -> tuple[str, ...]:
        """The log file at ``sample``'s iteration and epoch (the manager checks that no other
        extension writes it)."""
        return log_output_files(self._filename, self._writer, sample)

    def add_entry_listener(self, listener: Callable[[dict[str, Any]], object]) -> None:
        """Calls ``listener`` with each entry emitted from now on, once it is stored and written.

        It runs on the training thread inside the step that emits the entry, so it must be
        cheap and must not change the entry: a tracker hands the entry to its queue there, and
        needs no trigger of its own (nothing is consulted on the steps without an entry).
        Adding a listener twice calls it once. Listeners may be added and removed from any
        thread (a tracker's sender thread adds a one-shot one to raise a warning).
        """
        with _LISTENERS_LOCK:
            if listener not in self._listeners:
                self._listeners = (*self._listeners, listener)

    def remove_entry_listener(self, listener: Callable[[dict[str, Any]], object]) -> None:
        """Stops calling ``listener`` (no error when it was not added)."""
        with _LISTENERS_LOCK:
            self._listeners = tuple(item for item in self._listeners if item != listener)

    @property
    def log(self) -> list[dict[str, Any]]:
        """The entries emitted so far (including those restored by ``load_state_dict``)."""
        return list(self._log)

    @property
    def num_entries(self) -> int:
        """How many entries :attr:`log` holds (without copying it)."""
        return len(self._log)

    def entries_since(self, start: int) -> list[dict[str, Any]]:
        """The entries from index ``start`` on: what a reader that saw ``start`` lacks."""
        return self._log[start:]

    @property
    def entry_trigger(self) -> Trigger:
        """The trigger that decides when an entry is emitted (``trigger=``, e.g. per epoch).

        Not the extension's own trigger, which fires every iteration to accumulate.
        """
        return self._trigger

    def state_dict(self) -> dict[str, Any]:
        """Returns the log, the running summary and the trigger state (PPE's layout).

        ``_log`` is the JSON text of the entries, as in PPE; everything is a plain Python
        value, so ``torch.load(..., weights_only=True)`` reads it.
        """
        state: dict[str, Any] = {
            "_trigger": self._trigger.state_dict(),
            "_summary": self._summary.state_dict(),
            "_log": json.dumps(self._log),
        }
        if self._append:
            state["_file_entries"] = self._file_entries()
        return state

    def load_state_dict(self, to_load: Mapping[str, Any]) -> None:
        """Restores :meth:`state_dict`'s output; the log then continues where it stopped.

        Args:
            to_load: A dictionary from :meth:`state_dict` (or from PPE's LogReport); ``_log``
                may be JSON text or a list of dicts.
        """
        if to_load.get("_trigger") is not None:
            self._trigger.load_state_dict(to_load["_trigger"])
        summary = DictSummary()
        summary.load_state_dict(to_load.get("_summary") or {})
        self._summary = summary
        log = to_load.get("_log", [])
        entries = json.loads(log) if isinstance(log, str) else log
        self._log = [dict(entry) for entry in entries]
        # The restored entries were written by the run that saved them (append mode keeps the
        # file); otherwise the next entry rewrites the file from the restored log, dropping
        # what a killed run wrote after its snapshot.
        self._written = len(self._log)
        self._file = None
        self._due.reset()
        # An appending log repairs its file at its next write (see _prepare_append).
        self._prepared = False
        self._base = None
        self._restored = len(self._log)
        file_entries = to_load.get("_file_entries")
        self._restored_file_entries = file_entries if isinstance(file_entries, int) else None

    def finalize(self, manager: ManagerView) -> None:
        """Finalizes the writer given as ``writer=`` (the manager finalizes its own), as PPE.

        Args:
            manager: The manager that owns the extension.
        """
        finalize = getattr(self._writer, "finalize", None)
        if finalize is not None:
            finalize()

    @staticmethod
    def read(path: str | os.PathLike[str], format: str | None = None) -> list[dict[str, Any]]:
        """Reads a log file that a LogReport wrote, without the entry a kill tore.

        A process killed while it wrote an entry can leave that entry incomplete at the end of
        the file (nothing before it); it is dropped here, and a resumed run's first write
        drops it from the file. CSV cells come back as ``int`` or ``float`` where they parse
        as one (else as text), and an empty cell as a missing key.

        Args:
            path: The log file.
            format: One of :data:`LOG_REPORT_FORMATS`; inferred from the suffix when None, as
                ``LogReport(filename=...)`` does.

        Returns:
            The entries, as :attr:`log` held them.

        Raises:
            ConfigurationError: ``format`` is unknown.
            OptionalDependencyError: The ``'yaml'`` format without PyYAML installed.
            LogFileError: The file is damaged elsewhere than in its last entry (e.g. a CSV log
                truncated in place while rows were appended); a ``ValueError``.
        """
        name = os.fspath(path)
        fmt = _checked_format(format, name, "LogReport.read")
        with open(name, encoding="utf-8", newline="") as file_obj:
            text = file_obj.read()
        if fmt == "yaml":
            yaml: Any = importlib.import_module("yaml")
            return list(yaml.safe_load(text) or [])
        return read_entries(text, fmt, name)

    def to_dataframe(self) -> Any:
        """Returns the log as a ``pandas.DataFrame``.

        Raises:
            OptionalDependencyError: pandas is not installed.
        """
        try:
            pandas: Any = importlib.import_module("pandas")
        except ModuleNotFoundError as exc:
            raise OptionalDependencyError(
                "LogReport.to_dataframe() needs pandas; run `pip install pandas`"
            ) from exc
        return pandas.DataFrame(self._log)
