"""ProfileReport and TimeSummary: time tagged code sections and log their statistics."""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from ppe_core.errors import ConfigurationError
from ppe_core.profiler import TimeSummary, get_time_summary
from ppe_core.reporting import to_floats
from ppe_core.training.extension import Extension
from ppe_core.training.triggers import get_trigger
from ppe_core.writing import (
    OutputSample,
    WriterLike,
    log_output_files,
    write_file,
)
from ppe_extensions._log_report import (
    LOG_FORMATS,
    LogSaver,
    _checked_format,
    infer_format,
)

if TYPE_CHECKING:
    from ppe_core.training.extension import ManagerView
    from ppe_core.training.triggers import TriggerLike

__all__ = ["ProfileReport", "TimeSummary", "get_time_summary"]


class ProfileReport(Extension):
    """Logs statistics of the durations recorded with :meth:`TimeSummary.report`.

    Time sections with ``get_time_summary().report(tag)``. When the trigger fires, the
    extension takes the mean and standard deviation of every tag's durations recorded since
    the previous time (keys ``tag`` and ``tag.std``), appends them with ``epoch``,
    ``iteration`` and ``elapsed_time`` to its log, writes the log to ``filename`` through the
    writer, and reports the tags in ``report_keys`` as ``time.<tag>``. It runs only when the
    trigger fires.

    Args:
        store_keys: Tags to store in the log (with their ``.std``); every tag when None.
        report_keys: Tags whose mean is reported as ``time.<tag>``; none when None.
        trigger: When to summarize and write; once per epoch by default.
        filename: Log file name under the output directory (``'log'`` when None); a format
            string filled with the entry, e.g. ``'profile_{iteration}'``.
        append: Append each new entry to the file instead of rewriting it (``json-lines`` and
            ``yaml``); the extension then keeps no entries in memory.
        format: ``'json'``, ``'json-lines'`` or ``'yaml'`` (needs PyYAML); by default from the
            file name (``.jsonl``, ``.yaml``), else ``'json'``.
        writer: Writer to save through instead of the manager's.
        time_summary: Where durations are read from; this process's by default.
        log_name: PPE's older spelling of ``filename``, used when ``filename`` is None.

    Raises:
        ConfigurationError: ``format`` is unknown, or ``append`` is used with ``'json'``.
        OptionalDependencyError: ``'yaml'`` was selected and PyYAML is not installed.
    """

    def __init__(
        self,
        store_keys: Iterable[str] | None = None,
        report_keys: Iterable[str] | None = None,
        trigger: TriggerLike = (1, "epoch"),
        filename: str | os.PathLike[str] | None = None,
        append: bool = False,
        format: str | None = None,
        *,
        writer: WriterLike | None = None,
        time_summary: TimeSummary | None = None,
        log_name: str | os.PathLike[str] | None = None,
    ) -> None:
        # A Path names the same file its str form does (templates included).
        if filename is None:
            filename = "log" if log_name is None else log_name
        filename = os.fspath(filename)
        if format is None and infer_format(filename) == "csv":
            format = "json"  # LogReport's format only
        format = _checked_format(format, filename, "ProfileReport", LOG_FORMATS)
        if append and format == "json":
            raise ConfigurationError(
                "ProfileReport cannot append to a 'json' file (the result would not be valid "
                "JSON); use format='json-lines' (or a .jsonl file name) with append=True"
            )
        self._store_keys = (
            None
            if store_keys is None
            else frozenset(k for key in store_keys for k in (key, f"{key}.std"))
        )
        self._report_keys = None if report_keys is None else frozenset(report_keys)
        self._trigger = self.trigger = get_trigger(trigger)
        self._filename = filename
        self._append = append
        self._format = format
        self._writer = writer
        self._time_summary = get_time_summary() if time_summary is None else time_summary
        self._log: list[dict[str, Any]] = []

    @property
    def log(self) -> list[dict[str, Any]]:
        """The entries not yet written in append mode, else every entry (a copy)."""
        return [dict(entry) for entry in self._log]

    def __call__(self, manager: ManagerView) -> None:
        """Summarizes the recorded durations, reports and writes them."""
        with self._time_summary.summary(clear=True) as summary:
            stats = to_floats(summary.make_statistics())
        if self._report_keys is not None:
            manager.observation.update(
                {f"time.{k}": v for k, v in stats.items() if k in self._report_keys}
            )
        if self._store_keys is not None:
            stats = {k: v for k, v in stats.items() if k in self._store_keys}
        entry: dict[str, Any] = dict(stats)
        entry["epoch"] = manager.epoch
        entry["iteration"] = manager.iteration
        entry["elapsed_time"] = manager.elapsed_time
        entry = {key: entry[key] for key in sorted(entry)}
        self._log.append(entry)
        write_file(
            manager,
            self._writer,
            self._filename.format(**entry),
            list(self._log),
            LogSaver(self._format),
            append=self._append,
        )
        if self._append:
            self._log = []

    def output_files(self, sample: OutputSample) -> tuple[str, ...]:
        """The log file at ``sample``'s iteration and epoch (the manager checks that no other
        extension writes it: ``LogReport()`` beside ``ProfileReport()`` would share ``log``)."""
        return log_output_files(self._filename, self._writer, sample)

    def finalize(self, manager: ManagerView) -> None:
        """Finalizes the writer given to this extension (the manager finalizes its own)."""
        if self._writer is not None:
            self._writer.finalize()

    def state_dict(self) -> dict[str, Any]:
        """Returns the log as a JSON string and the trigger state (PPE's layout)."""
        return {"_trigger": self._trigger.state_dict(), "_log": json.dumps(self._log)}

    def load_state_dict(self, to_load: Mapping[str, Any]) -> None:
        """Restores the log (and the trigger, when saved) from :meth:`state_dict`."""
        if to_load.get("_trigger") is not None:
            self._trigger.load_state_dict(to_load["_trigger"])
        self._log = list(json.loads(to_load["_log"]))
