"""``LogReport``: accumulates observations and writes their interval means to a log file."""

from __future__ import annotations

import importlib
import importlib.util
import json
from collections.abc import Callable, Iterable, Mapping
from typing import IO, TYPE_CHECKING, Any, Protocol

from ppe_core.distributed import group_world
from ppe_core.errors import ConfigurationError, OptionalDependencyError
from ppe_core.reporting import DictSummary, to_floats
from ppe_core.training._extension import PRIORITY_READER, Extension
from ppe_core.training.extensions._util import key_tuple
from ppe_core.training.triggers import get_trigger
from ppe_core.training.triggers._due import DueCheck, EveryIteration

if TYPE_CHECKING:
    from ppe_core.training._protocols import ManagerView
    from ppe_core.training.triggers import Trigger, TriggerLike

__all__ = ["LOG_FORMATS", "LogReport", "LogSaver", "LogWriter"]

#: The accepted values of ``LogReport(format=...)`` (and ProfileReport's).
LOG_FORMATS = ("json", "json-lines", "yaml")

# Filename suffix -> format, used when ``format`` is None.
_SUFFIX_FORMATS = {".json": "json", ".jsonl": "json-lines", ".yaml": "yaml", ".yml": "yaml"}


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
    """The ``savefun`` for a list of log entries in one of :data:`LOG_FORMATS`.

    A module-level class so process-based writers can pickle it. ``'json'`` writes one JSON
    list; ``'json-lines'`` one object per line (appends stay valid); ``'yaml'`` a sequence
    (needs PyYAML; appended chunks concatenate into one longer sequence).
    """

    def __init__(self, fmt: str) -> None:
        self.fmt = fmt

    def __call__(self, target: list[dict[str, Any]], file_obj: IO[bytes]) -> None:
        if self.fmt == "json":
            text = json.dumps(target, indent=4)
        elif self.fmt == "json-lines":
            text = "".join(json.dumps(entry) + "\n" for entry in target)
        else:
            yaml: Any = importlib.import_module("yaml")
            text = yaml.safe_dump(target) if target else ""
        file_obj.write(text.encode("utf-8"))


class LogReport(Extension):
    """Writes the mean of every reported value over each interval to a log file.

    The extension runs after every iteration, but all it does then is add the observation to
    a :class:`~ppe_core.reporting.DictSummary` (tensors stay on their device, nothing
    synchronizes) and compare the iteration with the precomputed next due iteration of its
    own ``trigger``. When that trigger fires, it computes the means (one device-to-host copy),
    adds ``epoch``, ``iteration`` and ``elapsed_time``, appends the entry to :attr:`log`,
    writes the log through the manager's writer and starts a fresh summary.

    Args:
        keys: Names of the observed values to log; all values when None.
        trigger: When to emit an entry (anything ``get_trigger`` accepts); once per epoch by
            default. Distinct from the extension's own every-iteration trigger.
        postprocess: Called with each new entry (a dict) before it is stored and written; it
            may modify the entry in place.
        filename: Log file name under ``manager.out``; ``'log'`` when None. It may be a format
            string filled with the entry, e.g. ``'log_{iteration}'``.
        append: Append new entries to the file instead of rewriting it; needs the
            ``'json-lines'`` or ``'yaml'`` format.
        format: ``'json'`` (a JSON list, rewritten atomically), ``'json-lines'`` or
            ``'yaml'`` (needs PyYAML). Inferred from the filename suffix (``.json``,
            ``.jsonl``, ``.yaml``/``.yml``) when None; ``'json'`` otherwise.
        writer: Writer to save the file with; the manager's writer by default.

    Raises:
        ConfigurationError: ``format`` is unknown, or ``append=True`` with ``'json'``.
        OptionalDependencyError: The ``'yaml'`` format without PyYAML installed.

    Example::

        manager.extend(LogReport(trigger=(100, "iteration"), filename="log.jsonl"))
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
        if format not in LOG_FORMATS:
            raise ConfigurationError(
                f"LogReport format must be one of {list(LOG_FORMATS)}, got {format!r}; pass one "
                "of them, or leave format out and end the filename in .json, .jsonl or .yaml"
            )
        if format == "yaml":
            _require_yaml()
        if append and format == "json":
            raise ConfigurationError(
                "LogReport cannot append to a 'json' log (it is one JSON list); use "
                "format='json-lines' (e.g. filename='log.jsonl') or append=False"
            )
        # The extension itself runs every iteration to accumulate; `_trigger` decides output.
        self.trigger = EveryIteration()
        self._keys = None if keys is None else key_tuple(keys, "LogReport", "keys")
        self._trigger = get_trigger(trigger)
        self._postprocess = postprocess
        self._filename = filename
        self._append = append
        self._format = format
        self._writer = writer
        self._saver = LogSaver(format)
        self._summary = DictSummary()
        self._log: list[dict[str, Any]] = []
        # Entries already in the file (append mode writes only the rest).
        self._written = 0
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
        entry: dict[str, Any] = to_floats(self._summary.compute_mean())
        entry["epoch"] = manager.epoch
        entry["iteration"] = manager.iteration
        entry["elapsed_time"] = manager.elapsed_time
        if self._postprocess is not None:
            self._postprocess(entry)
        self._log.append(entry)
        self._summary = DictSummary()
        self._write(manager, entry)

    def _write(self, manager: ManagerView, entry: Mapping[str, Any]) -> None:
        if group_world()[1] != 0:
            # Under torch.distributed only rank 0 writes the file; every rank keeps the entries
            # (PrintReport, BestValue, ... read them) and its snapshots stay identical.
            self._written = len(self._log)
            return
        writer: Any = self._writer if self._writer is not None else getattr(manager, "writer", None)
        if writer is None:
            from ppe_core.writing import SimpleWriter

            writer = self._writer = SimpleWriter()
        filename = self._filename.format(**entry)
        if self._append:
            pending = self._log[self._written :]
            writer(filename, manager.out, pending, savefun=self._saver, append=True)
        else:
            # A copy: background writers serialize it after this returns.
            writer(filename, manager.out, list(self._log), savefun=self._saver, append=False)
        self._written = len(self._log)

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
        # The restored entries were written by the run that saved them.
        self._written = len(self._log)
        self._due.reset()

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
