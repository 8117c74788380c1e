"""LogReport's file formats beyond PPE's rewrite of the whole file per entry.

CSV rows and header, entries added to a JSON array in place, json-lines and YAML lines
from number templates that reproduce ``json.dumps`` and ``yaml.safe_dump`` byte for byte,
and reading a log back without the entry a kill tore. :class:`LogSaver
<ppe_extensions._log_report.LogSaver>` and ``LogReport`` use them.
"""

from __future__ import annotations

import csv
import importlib
import io
import json
import math
import os
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import IO, Any

from ppe_core.errors import LogFileError

if sys.platform != "win32":  # Windows extends the JSON array by a truncate and an append
    import fcntl

__all__ = [
    "csv_number_row",
    "csv_text",
    "entry_columns",
    "extend_json_array",
    "json_array_text",
    "json_entry_chunk",
    "json_line",
    "line_entries",
    "parse_entry",
    "read_entries",
    "yaml_number_item",
]


#: The columns a CSV log starts with (when its entries have them), whatever the keys' order.
_LEADING_COLUMNS = ("epoch", "iteration")


def entry_columns(entries: Iterable[Mapping[str, Any]]) -> list[str]:
    """A CSV log's header: ``epoch`` and ``iteration`` first (where a row is read from, and
    what LogReport adds after the reported means), then the other keys of ``entries`` in
    order of first appearance; a header widened by a new key keeps them first."""
    keys = dict.fromkeys(key for entry in entries for key in entry)
    leading = [key for key in _LEADING_COLUMNS if key in keys]
    return leading + [key for key in keys if key not in _LEADING_COLUMNS]


def csv_text(entries: Iterable[Mapping[str, Any]], columns: Sequence[str], *, header: bool) -> str:
    buffer = io.StringIO()
    rows = csv.writer(buffer, lineterminator="\n")
    if header:
        rows.writerow(columns)
    for entry in entries:
        rows.writerow(["" if entry.get(key) is None else entry[key] for key in columns])
    return buffer.getvalue()


def csv_number_row(entry: Mapping[str, Any], columns: Sequence[str]) -> str | None:
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

#: The layouts of :func:`_number_text`: a json-lines line, an element of the indented array,
#: and what adds an element to an array file: it overwrites the array's closing "\n]".
_LINE = "{%s}\n"
_ELEMENT = "    {\n        %s\n    }"
_EXTENSION = ",\n" + _ELEMENT + "\n]"

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
        # NaN and infinities have their own spellings (JSON's, YAML's). One sum is finite when
        # every value is; one that is not (or beyond a float's range) has each value checked.
        if not math.isfinite(sum(values)) and not all(map(math.isfinite, values)):
            return None
    except OverflowError:  # an int beyond a float's range
        return None
    return values


def _number_text(entry: Mapping[str, Any], layout: str) -> str | None:
    """``entry``'s JSON text in ``layout`` when its values are finite floats and ints, else None.

    ``layout`` is :data:`_LINE` (``json.dumps(entry) + "\\n"``), :data:`_ELEMENT` (the
    element ``json.dumps(log, indent=4)`` writes) or :data:`_EXTENSION` (that element as
    added to an array file). The keys' text is encoded once per key tuple into a %-template,
    so an entry costs the ``repr`` of its numbers (what ``json`` writes for them) and one
    format: about half what the C encoder spends on it. A non-empty dict only; anything else
    (text, None, bool, NaN, an int too large for a float) is left to the caller's encoder.
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


def yaml_number_item(entry: Mapping[str, Any]) -> str | None:
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
    return template % tuple(_yaml_number(entry[key]) for key in order) if template else None


def _yaml_number(value: float | int) -> str:
    if isinstance(value, int):  # bool never comes here (see _finite_numbers)
        return str(value)
    text = repr(value)
    if "." not in text and "e" in text:
        text = text.replace("e", ".0e", 1)
    return text


def _yaml_template(entry: Mapping[str, Any]) -> tuple[tuple[str, ...], str]:
    """The key order and %-template of :func:`yaml_number_item` for ``entry``'s keys."""
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


def json_line(entry: Mapping[str, Any]) -> str:
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
    return _ELEMENT % "".join(_encode_indented(entry, 0))[1:-1] if _is_flat(entry) else None


def json_array_text(entries: Sequence[Mapping[str, Any]]) -> str:
    """``json.dumps(entries, indent=4)``, byte for byte, in a fraction of its time (see
    :func:`_json_entry_text`); ``json.dumps`` itself where an entry is not flat."""
    parts = []
    for entry in entries:
        text = _json_entry_text(entry)
        if text is None:
            return json.dumps(entries, indent=4)
        parts.append(text)
    return "[\n" + ",\n".join(parts) + "\n]" if parts else "[]"


def _array_extension(body: str, size: int) -> tuple[int, bytes]:
    """Where to write what, to add the elements ``body`` to a JSON array file of ``size`` bytes.

    Over the array's closing ``\\n]``: ``",\\n" + body + "\\n]"``; a new (or empty, ``[]``)
    file gets the whole array.
    """
    if size <= 2:
        return 0, ("[\n" + body + "\n]").encode("utf-8")
    return size - 2, (",\n" + body + "\n]").encode("utf-8")


def json_entry_chunk(entry: Mapping[str, Any], size: int) -> tuple[int, bytes] | None:
    """What :func:`extend_json_array` writes for ``[entry]`` into a file of ``size`` bytes,
    and at which offset; None for an entry that is not flat (``json.dumps`` writes those).

    For a writer that does the write itself (see ``ppe_core.writing.Appender``).
    """
    if size > 2:  # the common case in one template: ",\n" + the element + "\n]"
        text = _number_text(entry, _EXTENSION)
        if text is not None:
            return size - 2, text.encode("utf-8")
    body = _json_entry_text(entry)
    return None if body is None else _array_extension(body, size)


def extend_json_array(
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
    body = json_array_text(entries)[2:-2]
    file_obj.flush()
    fd = file_obj.fileno()
    if size is None:
        size = os.fstat(fd).st_size
    offset, data = _array_extension(body, size)
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


def read_entries(text: str, fmt: str, name: str) -> list[dict[str, Any]]:
    """The entries of a log file's ``text`` in ``fmt`` (not YAML), without a torn last entry
    (see ``LogReport.read``); ``name`` is the file's, for the error.

    Raises:
        LogFileError: The file is damaged before its last entry.
    """
    if fmt == "json":
        return _read_json_array(text)
    complete = text[: text.rfind("\n") + 1]  # entries end with a newline; a torn one not
    if fmt == "json-lines":
        entries = []
        for number, line in enumerate(complete.splitlines(), 1):
            if line.strip():
                try:
                    entries.append(json.loads(line))
                except ValueError as exc:
                    raise _damaged(
                        name, f"line {number} is not JSON ({exc})", len(entries)
                    ) from None
        return entries
    return _read_csv(complete, name)


def _read_csv(complete: str, name: str) -> list[dict[str, Any]]:
    reader = csv.DictReader(io.StringIO(complete))
    header = reader.fieldnames or []
    numbers = [cell for cell in header if cell == "" or not isinstance(_csv_value(cell), str)]
    if numbers:
        # A data row read as the header: the file lost its start (truncated in place, or
        # overwritten) while rows were still appended to it.
        raise _damaged(
            name,
            f"its first line is not a header (it holds {numbers[:3]}), so the file lost its "
            "start (truncated or overwritten in place while a LogReport appended rows to it) "
            "and no row can be matched to its columns",
            None,
        )
    entries: list[dict[str, Any]] = []
    for row in reader:
        if None in row or None in row.values():  # more or fewer cells than the header
            problem = f"row {len(entries) + 1} has {'more' if None in row else 'fewer'} cells "
            raise _damaged(name, problem + "than the header", len(entries))
        entries.append({key: _csv_value(value) for key, value in row.items() if value != ""})
    return entries


def _damaged(name: str, problem: str, whole: int | None) -> LogFileError:
    """The error for a log file damaged before its last entry, with what to do."""
    kept = "" if whole is None else f" (the {whole} entries before it are whole)"
    return LogFileError(
        f"{name}: {problem}{kept}. A LogReport writes whole entries and a kill can tear only "
        "the last one, so something else changed the file. To get the whole log back, resume "
        "the run from its newest snapshot (a LogReport without append=True then writes the "
        "file again from the snapshot's log) or use the running LogReport's .log; or restore "
        "the file from a copy"
    )


def line_entries(data: bytes, fmt: str) -> list[tuple[int, int]]:
    """The ``(start, end)`` byte spans of the complete entries in a json-lines or YAML log.

    An entry ends with a newline: a json-lines entry is one line, a YAML entry (one item of
    the sequence ``yaml.safe_dump`` writes) runs from a line starting with ``-`` to the next
    such line. The entry a kill tore (the file does not end with a newline) is not among
    them, nor are blank lines. Used to repair a file before a run appends to it.
    """
    complete = data[: data.rfind(b"\n") + 1]
    spans: list[tuple[int, int]] = []
    pos = 0
    for line in complete.splitlines(keepends=True):
        end = pos + len(line)
        if fmt == "json-lines":
            if line.strip():
                spans.append((pos, end))
        elif line.startswith(b"-") or not spans:
            spans.append((pos, end))
        else:  # a YAML item's next line
            spans[-1] = (spans[-1][0], end)
        pos = end
    if (
        fmt == "yaml"
        and len(complete) < len(data)
        and spans
        and not data[len(complete) :].startswith(b"-")
    ):
        spans.pop()  # the torn item began on a complete line: all of it goes
    return spans


def parse_entry(data: bytes, fmt: str) -> Any:
    """The entry a span of :func:`line_entries` holds (None where it does not parse)."""
    if fmt == "json-lines":
        try:
            return json.loads(data)
        except ValueError:
            return None
    yaml: Any = importlib.import_module("yaml")
    try:
        items = yaml.safe_load(data)
    except yaml.YAMLError:
        return None
    return items[0] if isinstance(items, list) and len(items) == 1 else None
