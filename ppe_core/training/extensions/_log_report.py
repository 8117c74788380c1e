"""``LogReport``: accumulates observations and writes their interval means to a log file."""

from __future__ import annotations

import csv
import importlib
import importlib.util
import io
import json
import math
import os
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import IO, TYPE_CHECKING, Any, Protocol

from ppe_core.distributed import group_world
from ppe_core.errors import ConfigurationError, OptionalDependencyError
from ppe_core.reporting import DictSummary
from ppe_core.training._extension import PRIORITY_READER, Extension
from ppe_core.training.extensions._keys import key_tuple
from ppe_core.training.triggers import get_trigger
from ppe_core.training.triggers._due import DueCheck, EveryIteration
from ppe_core.writing import SimpleWriter, Writer

if sys.platform != "win32":  # Windows extends the JSON array by a truncate and an append
    import fcntl

if TYPE_CHECKING:
    from ppe_core.training._protocols import ManagerView
    from ppe_core.training.triggers import Trigger, TriggerLike

__all__ = ["LOG_FORMATS", "LOG_REPORT_FORMATS", "LogReport", "LogSaver", "LogWriter"]

#: The formats of :class:`LogSaver` that ProfileReport accepts (PPE's three).
LOG_FORMATS = ("json", "json-lines", "yaml")

#: The accepted values of ``LogReport(format=...)``: PPE's three and ``'csv'``.
LOG_REPORT_FORMATS = (*LOG_FORMATS, "csv")

# Filename suffix -> format, used when ``format`` is None.
_SUFFIX_FORMATS = {
    ".json": "json",
    ".jsonl": "json-lines",
    ".yaml": "yaml",
    ".yml": "yaml",
    ".csv": "csv",
}


class LogWriter(Protocol):
    """What LogReport needs of a writer: ``ppe_core.writing`` writers, TensorBoardWriter, ..."""

    def __call__(
        self,
        filename: str,
        out_dir: str,
        target: Any,
        *,
        savefun: Any = ...,
        append: bool = ...,
    ) -> None: ...


def _infer_format(filename: str) -> str:
    for suffix, fmt in _SUFFIX_FORMATS.items():
        if filename.endswith(suffix):
            return fmt
    return "json"


def _require_yaml() -> None:
    if importlib.util.find_spec("yaml") is None:
        raise OptionalDependencyError(
            "LogReport(format='yaml') needs PyYAML, which is not installed; run "
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
    :func:`_extend_json_array`), so each call costs what its entries cost, not the file.
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
                return _extend_json_array(target, file_obj, size)
            if len(target) == 1:  # the per-entry append of a log at every step: no detours
                row = None
                if self.fmt == "json-lines":
                    row = _json_line(target[0])
                elif self.fmt == "csv" and self.columns is not None:
                    row = _csv_number_row(target[0], self.columns)
                elif self.fmt == "yaml":
                    row = _yaml_number_item(target[0])
                if row is not None:
                    file_obj.write(row.encode("utf-8"))
                    return None
        if self.fmt == "json":
            text = _json_array_text(target)
        elif self.fmt == "json-lines":
            text = "".join(_json_line(entry) for entry in target)
        elif self.fmt == "csv":
            columns = _columns(target) if self.columns is None else self.columns
            text = _csv_text(target, columns, header=not self.extend)
        else:
            yaml: Any = importlib.import_module("yaml")
            text = yaml.safe_dump(target) if target else ""
        file_obj.write(text.encode("utf-8"))
        return None


def _columns(entries: Iterable[Mapping[str, Any]]) -> list[str]:
    """The keys of ``entries`` in order of first appearance: a CSV log's header."""
    return list(dict.fromkeys(key for entry in entries for key in entry))


def _csv_text(entries: Iterable[Mapping[str, Any]], columns: Sequence[str], *, header: bool) -> str:
    buffer = io.StringIO()
    rows = csv.writer(buffer, lineterminator="\n")
    if header:
        rows.writerow(columns)
    for entry in entries:
        rows.writerow(["" if entry.get(key) is None else entry[key] for key in columns])
    return buffer.getvalue()


def _csv_number_row(entry: Mapping[str, Any], columns: Sequence[str]) -> str | None:
    """``entry``'s CSV row when every cell is an ``int`` or ``float`` (else None).

    What ``csv.writer`` writes for such a row (``str`` of each number; no number needs
    quoting) without its buffer and writer objects, which cost more than the row.
    """
    cells = []
    for key in columns:
        value = entry.get(key)
        if value.__class__ is not float and value.__class__ is not int:
            return None  # text (may need quoting), None (an empty cell), bool, ...: csv does it
        cells.append(str(value))
    return ",".join(cells) + "\n"


#: The values whose JSON text does not depend on indentation.
_JSON_SCALARS = (float, int, str, bool, type(None))


def _json_encoder(item_separator: str) -> Callable[[Any, int], Sequence[str]]:
    """``json``'s C encoder with ``json.dumps``' defaults but ``item_separator``, built once.

    ``encode(entry, 0)`` returns the text in chunks. Only for flat entries (see
    :func:`_is_flat`): it has no circular-reference check, which a flat dict cannot need.
    ``json.dumps`` builds one per call behind two Python frames, and with ``indent`` uses
    the pure-Python encoder, whose cost was most of a JSON log's per-entry time.
    """
    make = getattr(json.encoder, "c_make_encoder", None)
    if make is None:  # no C accelerator (another interpreter): the same text, slower
        encoder = json.JSONEncoder(separators=(item_separator, ": "))
        return lambda entry, _level: (encoder.encode(entry),)
    c_encoder: Callable[[Any, int], Sequence[str]] = make(
        None,  # markers: no circular-reference check (flat entries only)
        None,  # default: flat entries hold only JSON's own types
        json.encoder.encode_basestring_ascii,  # ensure_ascii=True
        None,  # indent
        ": ",  # key separator
        item_separator,
        False,  # sort_keys
        False,  # skipkeys
        True,  # allow_nan
    )
    return c_encoder


#: A flat entry as ``json.dumps`` writes it.
_encode_line = _json_encoder(", ")

#: A flat entry as ``json.dumps(log, indent=4)`` writes the list's elements, with the first
#: line's indent and the last line missing: the C encoder with indent's separators.
_encode_indented = _json_encoder(",\n        ")


def _is_flat(entry: Mapping[str, Any]) -> bool:
    """Whether ``entry`` is a non-empty dict of ``str`` keys and scalar values (what
    LogReport's entries are, unless a ``postprocess`` adds a nested value)."""
    if entry.__class__ is not dict or not entry:
        return False
    for key, value in entry.items():
        if key.__class__ is not str or value.__class__ not in _JSON_SCALARS:
            return False
    return True


#: The value classes whose JSON text is their ``repr`` when finite (``json`` writes them with
#: ``float.__repr__`` and ``int.__repr__``); ``bool``, an ``int`` subclass, is not one.
_REPR_NUMBERS = frozenset((float, int))

#: The layouts of :func:`_number_text`: a json-lines line, an element of the indented array.
_LINE = "{%s}\n"
_ELEMENT = "    {\n        %s\n    }"

#: (layout, *keys) -> the layout's %-template for entries with those keys (see _number_text);
#: "" for keys that are not all text.
_TEMPLATES: dict[tuple[str, ...], str] = {}


def _finite_numbers(entry: Mapping[str, Any]) -> tuple[Any, ...] | None:
    """The values of a non-empty dict ``entry`` when all are finite ``float``/``int`` (exactly
    those types: not ``bool``), else None: the entries the number templates write."""
    if entry.__class__ is not dict or not entry:
        return None
    values = tuple(entry.values())
    if not _REPR_NUMBERS.issuperset(map(type, values)):
        return None
    try:
        if not all(map(math.isfinite, values)):
            return None  # NaN and infinities have their own spellings (JSON's, YAML's)
    except OverflowError:  # an int beyond a float's range
        return None
    return values


def _number_text(entry: Mapping[str, Any], layout: str) -> str | None:
    """``entry``'s JSON text in ``layout`` when its values are finite floats and ints, else None.

    ``layout`` is :data:`_LINE` (``json.dumps(entry) + "\\n"``) or :data:`_ELEMENT` (the
    element ``json.dumps(log, indent=4)`` writes). The keys' text is encoded once per key
    tuple into a %-template, so an entry costs the ``repr`` of its numbers (what ``json``
    writes for them) and one format: about half what the C encoder spends on it. A
    non-empty dict only; anything else (text, None, bool, NaN, an int too large for a float)
    is left to the caller's encoder.
    """
    values = _finite_numbers(entry)
    if values is None:
        return None
    key = (layout, *entry)
    template = _TEMPLATES.get(key)
    if template is None:
        template = _number_template(key[1:], layout)
        if len(_TEMPLATES) >= 64:  # e.g. keys that change per entry
            _TEMPLATES.clear()
        _TEMPLATES[key] = template
    return template % values if template else None


def _number_template(keys: Sequence[Any], layout: str) -> str:
    """The %-template of :func:`_number_text` for ``keys``; "" unless all are ``str``."""
    if any(key.__class__ is not str for key in keys):
        return ""
    separator = ", " if layout == _LINE else ",\n        "
    items = separator.join(
        json.encoder.encode_basestring_ascii(key).replace("%", "%%") + ": %r" for key in keys
    )
    return layout.replace("%s", items)


#: Insertion-ordered keys -> (the keys sorted as ``yaml.safe_dump`` writes them, the
#: %-template of one sequence item); "" for keys whose template did not check out.
_YAML_TEMPLATES: dict[tuple[str, ...], tuple[tuple[str, ...], str]] = {}

#: Placeholder values a YAML template is dumped with: plain ints no key can be mistaken for.
_YAML_MARK = 7_130_000_000_000


def _yaml_number_item(entry: Mapping[str, Any]) -> str | None:
    """``yaml.safe_dump([entry])`` when ``entry``'s values are finite floats and ints, else None.

    PyYAML's emitter costs about 200 us per entry, four times the rest of a per-iteration
    log entry. The item's text is dumped once per key tuple with placeholder values and
    turned into a %-template, which is checked against the real dump of the first entry that
    uses it (a key YAML writes in another style fails the check and keeps the slow path).
    Numbers are written as PyYAML writes them: ``str`` of an int, ``repr`` of a float with
    ``.0`` put before an exponent that has no decimal point.
    """
    if _finite_numbers(entry) is None:
        return None
    keys = tuple(entry)
    cached = _YAML_TEMPLATES.get(keys)
    if cached is None:
        cached = _YAML_TEMPLATES[keys] = _yaml_template(entry)
        if len(_YAML_TEMPLATES) > 64:  # e.g. keys that change per entry
            _YAML_TEMPLATES.clear()
    order, template = cached
    if not template:
        return None
    return template % tuple(_yaml_number(entry[key]) for key in order)


def _yaml_number(value: float | int) -> str:
    if isinstance(value, int):  # bool never comes here (see _finite_numbers)
        return str(value)
    text = repr(value)
    if "." not in text and "e" in text:
        text = text.replace("e", ".0e", 1)
    return text


def _yaml_template(entry: Mapping[str, Any]) -> tuple[tuple[str, ...], str]:
    """The key order and %-template of :func:`_yaml_number_item` for ``entry``'s keys."""
    if any(key.__class__ is not str for key in entry):
        return (), ""
    yaml: Any = importlib.import_module("yaml")
    order = tuple(sorted(entry))
    marks = {key: _YAML_MARK + i for i, key in enumerate(order)}
    text = yaml.safe_dump([marks]).replace("%", "%%")
    for mark in marks.values():
        if text.count(str(mark)) != 1:
            return (), ""
        text = text.replace(str(mark), "%s")
    values = tuple(_yaml_number(entry[key]) for key in order)
    if text % values != yaml.safe_dump([dict(entry)]):
        return (), ""
    return order, text


def _json_line(entry: Mapping[str, Any]) -> str:
    """``json.dumps(entry) + "\\n"``: a json-lines log's line."""
    text = _number_text(entry, _LINE)
    if text is not None:
        return text
    if _is_flat(entry):
        return "".join(_encode_line(entry, 0)) + "\n"
    return json.dumps(entry) + "\n"


def _json_entry_text(entry: Mapping[str, Any]) -> str | None:
    """``entry`` as ``json.dumps(log, indent=4)`` writes an element of the list, or None.

    Only for a flat entry (:func:`_is_flat`): the C encoder with indent's separators gives
    the same bytes. Any other entry is left to ``json.dumps``.
    """
    text = _number_text(entry, _ELEMENT)
    if text is not None:
        return text
    if not _is_flat(entry):
        return None
    return "    {\n        " + "".join(_encode_indented(entry, 0))[1:-1] + "\n    }"


def _json_array_text(entries: Sequence[Mapping[str, Any]]) -> str:
    """``json.dumps(entries, indent=4)``, byte for byte, in a fraction of its time (see
    :func:`_json_entry_text`); ``json.dumps`` itself where an entry is not flat."""
    parts = []
    for entry in entries:
        text = _json_entry_text(entry)
        if text is None:
            return json.dumps(entries, indent=4)
        parts.append(text)
    if not parts:
        return "[]"
    return "[\n" + ",\n".join(parts) + "\n]"


def _extend_json_array(
    entries: list[dict[str, Any]], file_obj: IO[bytes], size: int | None = None
) -> int | None:
    """Adds ``entries`` to the JSON array (``json.dumps(log, indent=4)``) in ``file_obj``.

    The new entries overwrite the array's closing ``\\n]`` and end with a new one, in one
    positioned write, so the file is byte for byte ``json.dumps`` of the longer log and the
    cost does not depend on its length. A kill can tear only that one write (the kernel
    stops a write only between pages); the file then lacks its end, which
    :meth:`LogReport.read` and a resumed run's first write repair. ``file_obj`` is the
    writer's handle of the file: opened without ``O_APPEND`` (mode ``'wb'``) by writers that
    honour :attr:`LogSaver.positional`, so the write is one ``pwrite``; a handle opened for
    appending (``'ab'``) has the flag cleared around it (``fcntl``). Where the platform has
    neither ``pwrite`` nor ``fcntl`` (Windows) the handle is positioned and written, and an
    appending handle's end truncated first, two calls instead of one. ``size`` is the file's
    size when the caller knows it (the writer keeps it between appends); else ``fstat``.
    Returns the file's size after the write (``size`` unchanged when ``entries`` is empty).
    """
    if not entries:
        return size
    # The elements, "    {...},\n    {...}": what the array holds between "[\n" and "\n]".
    body = _json_entry_text(entries[0]) if len(entries) == 1 else None
    if body is None:
        body = _json_array_text(entries)[2:-2]
    file_obj.flush()
    fd = file_obj.fileno()
    if size is None:
        size = os.fstat(fd).st_size
    if size <= 2:  # a new (or empty, "[]") file: the whole array
        offset, data = 0, ("[\n" + body + "\n]").encode("utf-8")
    else:  # overwrite "\n]" with ",\n" + the entries + "\n]"
        offset, data = size - 2, (",\n" + body + "\n]").encode("utf-8")
    appending = "a" in getattr(file_obj, "mode", "a")  # O_APPEND moves writes to the end
    if sys.platform == "win32":
        if appending:
            file_obj.truncate(offset)
        else:
            file_obj.seek(offset)
        file_obj.write(data)
        return offset + len(data)
    flags = fcntl.fcntl(fd, fcntl.F_GETFL) if appending else 0
    if appending:
        fcntl.fcntl(fd, fcntl.F_SETFL, flags & ~os.O_APPEND)
    try:
        done = os.pwrite(fd, data, offset)
        while done < len(data):  # a short write (a signal, a full disk's last block)
            done += os.pwrite(fd, data[done:], offset + done)
    finally:
        if appending:  # the writer may keep the handle open for its next append
            fcntl.fcntl(fd, fcntl.F_SETFL, flags)
    return offset + len(data)


def _read_json_array(text: str) -> list[dict[str, Any]]:
    """The entries of a JSON log; of one whose end a kill tore, the complete ones."""
    try:
        entries: list[dict[str, Any]] = json.loads(text)
        return entries
    except json.JSONDecodeError:
        pass
    decoder = json.JSONDecoder()
    entries = []
    start = text.find("[")
    if start < 0 or text[:start].strip():
        raise ValueError("not a JSON log: it does not start with '['")
    pos = start + 1
    while True:
        while pos < len(text) and text[pos] in " \t\r\n,":
            pos += 1
        try:
            entry, pos = decoder.raw_decode(text, pos)
        except json.JSONDecodeError:
            return entries  # the torn last entry (or the missing end) of a killed write
        entries.append(entry)


def _csv_value(cell: str) -> Any:
    for kind in (int, float):
        try:
            return kind(cell)
        except ValueError:
            pass
    return cell


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
            ``'yaml'`` format.
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
        filename: str | None = None,
        append: bool = False,
        format: str | None = None,
        writer: LogWriter | None = None,
    ) -> None:
        if filename is None:
            filename = "log"
        if format is None:
            format = _infer_format(filename)
        if format not in LOG_REPORT_FORMATS:
            raise ConfigurationError(
                f"LogReport format must be one of {list(LOG_REPORT_FORMATS)}, got {format!r}; "
                "pass one of them, or leave format out and end the filename in .json, .jsonl, "
                ".yaml or .csv"
            )
        if format == "yaml":
            _require_yaml()
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
        # The writer that wrote the file whole, if entries can be added to the file through it
        # (see _extends), and its append_reopens then.
        self._extending: Any = None  # a Writer (Any: the manager's writer is typed Any)
        self._reopens = 0
        self._due = DueCheck(self._trigger)

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

    def _write(self, manager: ManagerView, entry: Mapping[str, Any]) -> None:
        writer: Any = self._writer if self._writer is not None else getattr(manager, "writer", None)
        if writer is None:
            writer = self._writer = SimpleWriter()
        # A name without a field is the common case; formatting it per entry costs a dict.
        filename = self._filename if self._static_filename else self._filename.format(**entry)
        if (
            writer is self._extending
            and filename == self._file
            and (self._format != "csv" or self._columns.keys() >= entry.keys())  # else: wider
        ):
            # Added to the file this LogReport wrote whole through this writer, which only
            # rank 0 does (decided then, so no rank check per entry).
            writer(filename, manager.out, [entry], savefun=self._extender, append=True)
            if writer.append_reopens != self._reopens:
                # The writer found a file replaced or removed under it (it checks once per
                # sync interval): the log is written whole again, the entries appended to
                # the old file within that interval included.
                self._rewrite(writer, filename, manager.out)
        elif group_world()[1] != 0:
            # Under torch.distributed only rank 0 writes the file; every rank keeps the entries
            # (PrintReport, BestValue, ... read them) and its snapshots stay identical.
            pass
        elif self._append:
            pending = self._log[self._written :]
            writer(filename, manager.out, pending, savefun=self._saver, append=True)
        else:
            self._rewrite(writer, filename, manager.out)
        self._written = len(self._log)

    def _rewrite(self, writer: Any, filename: str, out: str) -> None:
        """Replaces the file with the whole log; later entries are added to it."""
        if self._format == "csv":
            self._columns = dict.fromkeys(_columns(self._log))
            self._saver = LogSaver("csv", tuple(self._columns))
            self._extender = LogSaver("csv", tuple(self._columns), extend=True)
        # A copy: background writers serialize it after this returns.
        writer(filename, out, list(self._log), savefun=self._saver, append=False)
        self._file = filename
        self._extending = writer if self._extends(writer) else None
        self._reopens = getattr(writer, "append_reopens", 0)

    def _extends(self, writer: Any) -> bool:
        """Whether later entries can be added to the file ``writer`` wrote (instead of it
        being rewritten whole); for CSV, also only entries without a new key."""
        if not isinstance(writer, Writer):
            return False  # PPE's protocol: a custom writer gets the whole log every time
        return self._format != "json" or writer.writes_local_files  # JSON edits in place

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
        return {
            "_trigger": self._trigger.state_dict(),
            "_summary": self._summary.state_dict(),
            "_log": json.dumps(self._log),
        }

    def load_state_dict(self, to_load: Mapping[str, Any]) -> None:
        """Restores :meth:`state_dict`'s output; the log then continues where it stopped.

        Args:
            to_load: A dictionary from :meth:`state_dict` (or from PPE's LogReport); ``_log``
                may be JSON text or a list of dicts.
        """
        trigger_state = to_load.get("_trigger")
        if trigger_state is not None:
            self._trigger.load_state_dict(trigger_state)
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
            ValueError: The file is damaged elsewhere than in its last entry.
        """
        name = os.fspath(path)
        fmt = _infer_format(name) if format is None else format
        if fmt not in LOG_REPORT_FORMATS:
            raise ConfigurationError(
                f"LogReport.read format must be one of {list(LOG_REPORT_FORMATS)}, got {fmt!r}"
            )
        with open(name, encoding="utf-8", newline="") as file_obj:
            text = file_obj.read()
        if fmt == "yaml":
            _require_yaml()
            yaml: Any = importlib.import_module("yaml")
            return list(yaml.safe_load(text) or [])
        if fmt == "json":
            return _read_json_array(text)
        complete = text[: text.rfind("\n") + 1]  # entries end with a newline; a torn one not
        if fmt == "json-lines":
            return [json.loads(line) for line in complete.splitlines() if line.strip()]
        entries: list[dict[str, Any]] = []
        for row in csv.DictReader(io.StringIO(complete)):
            if None in row:  # DictReader's key for the cells beyond the header
                raise ValueError(f"{name}: row {len(entries) + 1} has more cells than the header")
            entries.append({key: _csv_value(value) for key, value in row.items() if value != ""})
        return entries

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
