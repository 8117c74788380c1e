"""``PrintReport``: prints LogReport's entries as a fixed-width table."""

from __future__ import annotations

import contextlib
import difflib
import numbers
import sys
import warnings
from collections.abc import Mapping, Sequence
from typing import IO, TYPE_CHECKING, Any

from ppe_core.distributed import group_world
from ppe_core.errors import ConfigurationError, MissingObservationWarning
from ppe_core.logging import is_terminal
from ppe_core.training.extension import PRIORITY_READER, Extension
from ppe_extensions._keys import key_tuple
from ppe_extensions._log_reader import NewEntriesTrigger, find_log_report
from ppe_extensions._log_report import LogReport

if TYPE_CHECKING:
    from ppe_core.training.extension import ManagerView

__all__ = ["PrintReport"]

# Narrowest column, as in PPE; wider names widen their column.
_MIN_WIDTH = 10


def _column_order(seen: Sequence[str], unit: str) -> list[str]:
    """Orders inferred columns as PPE does: the trigger's unit first, elapsed_time last.

    With an epoch trigger the ``iteration`` column is left out (and ``epoch`` with an
    iteration trigger), which keeps the table narrow.
    """
    rest = [key for key in seen if key not in ("epoch", "iteration", "elapsed_time")]
    head = [unit] if unit in seen else []
    tail = ["elapsed_time"] if "elapsed_time" in seen else []
    return head + rest + tail


def _format_cell(value: Any, width: int) -> str:
    if not isinstance(value, bool) and isinstance(value, numbers.Real):
        if isinstance(value, numbers.Integral):
            return f"{int(value):<{width}d}  "
        return f"{float(value):<{width}g}  "
    return f"{value!s:<{width}}  "  # text, a bool, ...


class PrintReport(Extension):
    """Prints each new LogReport entry as one row of a fixed-width table.

    The header is printed before the first row (and again when new columns appear). Columns
    are ``max(len(name), 10)`` characters wide and separated by two spaces; floats use the
    ``g`` format. The extension is only consulted when its LogReport can have written an
    entry, so it costs nothing per iteration.

    Args:
        entries: Names of the values to print, in order; when None, every key the log has
            shown so far, ordered as PPE does (the LogReport's trigger unit first,
            ``elapsed_time`` last).
        log_report: Name of the registered :class:`LogReport` to read, or a LogReport
            instance that this extension feeds itself (then it runs every iteration).
        out: Text stream to print to; ``sys.stdout`` (at construction time) when None.

    A name in ``entries`` that no log entry has by the end of the first epoch (or of a
    shorter run) warns once with :class:`MissingObservationWarning`, naming the keys the
    entries have: its column would stay empty (a misspelt key, or nothing reports it).

    Example::

        manager.extend(LogReport())
        manager.extend(PrintReport(["epoch", "main/loss", "val/loss", "elapsed_time"]))
    """

    # Just below LogReport's priority: a row is printed in the iteration its entry appears,
    # whatever the registration order.
    priority = PRIORITY_READER - 1

    def __init__(
        self,
        entries: Sequence[str] | None = None,
        log_report: str | LogReport = "LogReport",
        out: IO[str] | None = None,
    ) -> None:
        if not isinstance(log_report, (str, LogReport)):
            raise ConfigurationError(
                "PrintReport log_report must be the name of a registered LogReport or a "
                f"LogReport instance, got {type(log_report).__name__}"
            )
        self.trigger = NewEntriesTrigger(self)
        self._infer = entries is None
        self._columns: list[str] = (
            [] if entries is None else list(key_tuple(entries, "PrintReport", "entries"))
        )
        self._seen: list[str] = []
        self._log_report = log_report
        self._feeds_log_report = isinstance(log_report, LogReport)
        self._resolved: LogReport | None = log_report if isinstance(log_report, LogReport) else None
        self._out: IO[str] = sys.stdout if out is None else out
        # Number of log entries already printed (or skipped); restored from snapshots.
        self._printed = 0
        self._restored = False
        self._header_due = True
        # Whether the explicit entries were checked against the log's keys (once per process).
        self._keys_checked = self._infer

    def _resolve(self, manager: ManagerView) -> LogReport:
        if self._resolved is None:
            assert isinstance(self._log_report, str)
            self._resolved = find_log_report(manager, self._log_report, "PrintReport")
        return self._resolved

    def initialize(self, manager: ManagerView) -> None:
        """Finds the LogReport; entries it already holds (from earlier runs) are not printed."""
        log_report = self._resolve(manager)
        if not self._restored:
            self._printed = log_report.num_entries

    @property
    def scheduled_log_report(self) -> LogReport | None:
        """The registered LogReport whose entry schedule decides when this one is due.

        None while it is not found yet, or when this extension feeds a LogReport instance
        itself (it then runs every iteration).
        """
        return None if self._feeds_log_report else self._resolved

    def has_new_entries(self, manager: ManagerView) -> bool:
        """Whether the LogReport holds entries this extension has not printed yet."""
        return self._feeds_log_report or self._resolve(manager).num_entries > self._printed

    def __call__(self, manager: ManagerView) -> None:
        """Prints the LogReport entries that appeared since the last call."""
        log_report = self._resolve(manager)
        if self._feeds_log_report:
            log_report(manager)
        self._print_new(log_report)

    def finalize(self, manager: ManagerView) -> None:
        """Prints entries that are still unprinted (e.g. emitted after the last call)."""
        if self._resolved is not None:
            self._print_new(self._resolved)
            if not self._keys_checked and self._resolved.num_entries:
                self._warn_missing_keys(self._resolved, "this run")

    def _print_new(self, log_report: LogReport) -> None:
        if log_report.num_entries <= self._printed:
            return
        new = log_report.entries_since(self._printed)
        self._printed = log_report.num_entries
        if self._infer:
            self._update_columns(new, log_report)
        if group_world()[1] != 0:  # under torch.distributed only rank 0 prints the table
            return
        out = self._out
        # A tqdm bar on the same terminal is cleared and redrawn around the rows, so rows and
        # bar do not overwrite each other. tqdm is only consulted if something imported it.
        tqdm_module = sys.modules.get("tqdm")
        writing: contextlib.AbstractContextManager[object] = contextlib.nullcontext()
        if tqdm_module is not None and is_terminal(out):
            writing = tqdm_module.tqdm.external_write_mode(file=out)
        with writing:
            if self._header_due:
                out.write(self._header())
                self._header_due = False
            for entry in new:
                out.write(self._row(entry))
            flush = getattr(out, "flush", None)
            if flush is not None:
                flush()
        # Once the first epoch's entries are in: a key an evaluator reports at the epoch's end
        # is absent from the entries of a per-iteration log before it.
        epoch = new[-1].get("epoch", 1)
        if not self._keys_checked and (not isinstance(epoch, (int, float)) or epoch >= 1):
            self._warn_missing_keys(log_report, "the first epoch")

    def _warn_missing_keys(self, log_report: LogReport, through: str) -> None:
        """Warns once of the columns that no entry of ``log_report`` has (empty columns)."""
        self._keys_checked = True
        seen = dict.fromkeys(key for entry in log_report.entries_since(0) for key in entry)
        missing = [name for name in self._columns if name not in seen]
        if not missing:
            return
        hints = []
        for name in missing:
            close = difflib.get_close_matches(name, list(seen), n=1)
            hints.append(f"{name!r} (did you mean {close[0]!r}?)" if close else repr(name))
        warnings.warn(
            MissingObservationWarning(
                f"PrintReport prints an empty column for {', '.join(hints)}: no log entry of "
                f"{through} has it. The entries have {', '.join(map(repr, seen))}; check the "
                "name, or that something reports it (ppe.reporting.report, an evaluator's "
                "'val/<output>')"
            ),
            stacklevel=2,
        )

    def _update_columns(self, new: Sequence[Mapping[str, Any]], log_report: LogReport) -> None:
        seen = self._seen
        known = len(seen)
        for entry in new:
            seen += [key for key in entry if key not in seen]
        if len(seen) > known:
            unit = getattr(log_report.entry_trigger, "unit", "epoch")
            columns = _column_order(seen, unit if unit in ("epoch", "iteration") else "epoch")
            if columns != self._columns:
                self._columns = columns
                self._header_due = True

    def _header(self) -> str:
        return "  ".join(f"{name:{max(_MIN_WIDTH, len(name))}}" for name in self._columns) + "\n"

    def _row(self, entry: Mapping[str, Any]) -> str:
        # A missing value is an empty cell: "" formats as the column's spaces.
        cells = (
            _format_cell(entry.get(name, ""), max(_MIN_WIDTH, len(name))) for name in self._columns
        )
        return "".join(cells) + "\n"

    def state_dict(self) -> dict[str, Any]:
        """Returns how many log entries were printed and the inferred columns.

        A resumed run therefore prints only rows it has not printed before (and its header
        once, since the output stream is new). A LogReport instance passed as ``log_report``
        is saved here too, as in PPE.
        """
        state = self._printed_state()
        if isinstance(self._log_report, LogReport):
            state["_log_report"] = self._log_report.state_dict()
        return state

    def load_state_dict(self, to_load: Mapping[str, Any]) -> None:
        """Restores :meth:`state_dict`'s output (PPE's, which may be empty, is accepted)."""
        if isinstance(self._log_report, LogReport) and "_log_report" in to_load:
            self._log_report.load_state_dict(to_load["_log_report"])
        self._load_printed_state(to_load)

    def _printed_state(self) -> dict[str, Any]:
        """What was printed: the entries' count, the inferred columns and the keys seen."""
        return {
            "_printed": self._printed,
            "_columns": list(self._columns),
            "_seen": list(self._seen),
        }

    def _load_printed_state(self, to_load: Mapping[str, Any]) -> None:
        """Restores :meth:`_printed_state`'s output; the header is printed again."""
        if "_printed" in to_load:
            self._printed = int(to_load["_printed"])
            self._restored = True
        if self._infer and "_columns" in to_load:
            self._columns = [str(name) for name in to_load["_columns"]]
            self._seen = [str(name) for name in to_load.get("_seen", self._columns)]
        self._header_due = True
