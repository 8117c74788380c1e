"""``BaseTracker``: sends LogReport's entries to an experiment tracker off the training thread."""

from __future__ import annotations

import dataclasses
import functools
import glob
import os
import queue
import threading
import time
import types
import uuid
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from ppe_core import __version__
from ppe_core.distributed import group_world
from ppe_core.errors import ConfigurationError, TrackerWarning
from ppe_core.runtime import get_runtime
from ppe_core.training.extension import PRIORITY_READER, Extension
from ppe_core.training.triggers import get_trigger
from ppe_core.writing import Writer
from ppe_extensions._log_reader import find_log_report
from ppe_extensions.tracking._channel import COUNTS_LOCK as _COUNTS_LOCK
from ppe_extensions.tracking._channel import Pump, TrackerReport
from ppe_extensions.tracking._sender import ProcessSender, unsendable_reason
from ppe_extensions.tracking._shared_dir import check_shared_out_dir

if TYPE_CHECKING:
    from ppe_core.training.extension import ManagerView
    from ppe_extensions._log_report import LogReport

__all__ = ["BaseTracker", "TrackerEntry", "TrackerReport"]

# The manifest of a complete SnapshotMode.DCP snapshot directory (its name, not imported: the
# snapshot modules import torch.distributed.checkpoint helpers).
_DCP_MANIFEST = ".ppe_core_manifest.json"

#: The default ``snapshot`` names (``snapshot_iter_{.iteration}``): what ``snapshots=True``
#: uploads.
SNAPSHOT_PATTERN = "snapshot_iter_*"

# The longest pause between two retries, whatever ``retry_backoff`` doubles to.
_MAX_BACKOFF = 30.0


#: Where a tracker's backend methods may run (``sender=``).
SENDERS = ("thread", "process")

# Attributes that live only while a run trains: never pickled into a sender process.
_RUNTIME_STATE = (
    "trigger",
    "_log_report",
    "_worker",
    "_process",
    "_pump",
    "_listening",
    "_pending",
    "_abandon",
    "_counts",
    "_on_counts",
    "_notices",
)

# Guards the notices a sender thread leaves for the training thread (see _announce).
_NOTICES_LOCK = threading.Lock()

# Scalar types a param may have; anything else (a tensor, a list of tensors) is left out.
_PARAM_TYPES = (str, int, float, bool, type(None))


@dataclasses.dataclass(frozen=True)
class TrackerEntry:
    """One LogReport entry as a tracker receives it.

    Attributes:
        step: The entry's ``iteration`` (so a resumed run continues its steps).
        metrics: Every numeric value of the entry (``epoch``, ``iteration`` and
            ``elapsed_time`` included), as floats.
    """

    step: int
    metrics: dict[str, float]


class BaseTracker(Extension):
    """Base class of experiment-tracker extensions: LogReport's entries, never blocking a step.

    When the registered LogReport emits an entry, it appends it to the tracker's bounded
    queue (the queue's own ``append`` is LogReport's entry listener: no Python code of the
    tracker runs on the training thread); the manager never calls the tracker, so a step
    without an entry pays nothing for it. A daemon pump thread looks at the queue every
    ``send_interval`` seconds (within 2-50 ms) and hands batches (``batch_size`` entries, or
    what waited ``send_interval`` seconds) to a daemon worker, which calls the backend
    methods below, retrying a failed call with exponential backoff. The training thread
    never calls the backend, so a slow or unreachable server never slows or stops training:

    * the worker holds at most two batches; when the backend is slower than LogReport
      emits, entries wait in the queue, and an entry put into a full queue drops the oldest
      waiting one. When the pump finds drops it leaves one :class:`TrackerWarning`, which
      the training thread raises with LogReport's next entry, and the total is reported
      when training ends;
    * at the end of training (:meth:`finalize`) the worker gets ``flush_timeout`` seconds to
      send what is queued; what was not sent (dropped, refused, still queued) is counted in
      one :class:`TrackerWarning`, and :attr:`report` holds the counts;
    * the step of an entry is its ``iteration``, and the run id is saved in the extension's
      ``state_dict``: a resumed run continues the same tracker run at the resumed iteration,
      skipping the steps the backend already holds (:meth:`last_step`).

    Under torch.distributed only rank 0 sends anything (as only rank 0 writes LogReport's
    file).

    With ``sender="process"`` the backend methods run in a sender process instead of a
    thread, so the backend's client never holds the training process's GIL: the pump hands
    batches over through a pipe (one pickle per batch). The child is
    ``python -m ppe_extensions.tracking._child`` (the script is never re-run), rebuilt from this
    instance pickled without its runtime state (:meth:`__getstate__`): the subclass must be
    importable (not defined in ``__main__``) and picklable once constructed, and create its
    client lazily in the backend methods.
    A tracker that is not falls back to the thread with a :class:`TrackerWarning` saying why.
    The child exits when the parent dies (stdin EOF); its errors reach :attr:`report`.

    Subclasses implement the backend methods, all called on the worker thread:
    :meth:`open_run` and :meth:`log_metrics` (required), :meth:`log_params`,
    :meth:`last_step`, :meth:`log_artifact` and :meth:`close_run`. :meth:`run_params`
    runs on the training thread, once, and must not touch the network.

    Args:
        log_report: Name of the registered LogReport whose entries are sent.
        params: Extra run params, merged over :meth:`run_params`' (optimizer, trainer options,
            runtime).
        artifacts: Glob patterns, relative to the manager's ``out`` directory, of files to
            upload as artifacts once they appear (e.g. ``"snapshot_iter_*"``); checked by the
            worker after each batch and at the end. A ``SnapshotMode.DCP`` snapshot's
            directory is uploaded whole once complete; under torch.distributed the tracker
            checks at start that rank 0 sees every rank's shards in it (a shared file
            system), and raises :class:`~ppe_core.errors.ConfigurationError` on every rank
            when not: the upload would hold only rank 0's node's shards.
        snapshots: Also upload the snapshots (``snapshot_iter_*``, the default names of
            ``snapshot``) as artifacts; a string is another glob pattern.
        queue_size: Entries waiting in the queue before each new one drops the oldest (besides
            them, at most two batches are in the worker's or sender process's hands).
        batch_size: Most entries handed to one :meth:`log_metrics` call.
        send_interval: Seconds an entry may wait for its batch to fill before it is sent
            (the pump looks every ``send_interval`` seconds, within 2-50 ms).
        max_retries: Retries of a failed backend call before its entries count as failed.
        retry_backoff: Seconds before the first retry; doubled for each next one (at most 30).
        flush_timeout: Seconds :meth:`finalize` waits for the queue to drain.
        sender: ``"thread"`` (a daemon thread of this process) or ``"process"`` (a sender
            process; see above) runs the backend methods.

    Example::

        class PrintTracker(BaseTracker):
            def open_run(self, run_id):
                return run_id or "run-1"

            def log_metrics(self, entries):
                for entry in entries:
                    print(entry.step, entry.metrics)
    """

    # Just below LogReport: an entry is queued in the iteration it appears.
    priority = PRIORITY_READER - 1

    def __init__(
        self,
        *,
        log_report: str = "LogReport",
        params: Mapping[str, Any] | None = None,
        artifacts: str | Sequence[str] = (),
        snapshots: bool | str = False,
        queue_size: int = 10_000,
        batch_size: int = 100,
        send_interval: float = 1.0,
        max_retries: int = 3,
        retry_backoff: float = 0.5,
        flush_timeout: float = 30.0,
        sender: str = "thread",
    ) -> None:
        name = type(self).__name__
        if sender not in SENDERS:
            raise ConfigurationError(
                f"{name} sender must be one of {', '.join(map(repr, SENDERS))}, got {sender!r}"
            )
        if not isinstance(log_report, str):
            raise ConfigurationError(
                f"{name} log_report must be the name of a registered LogReport, got "
                f"{type(log_report).__name__}"
            )
        for arg, value, least in (
            ("queue_size", queue_size, 1),
            ("batch_size", batch_size, 1),
            ("max_retries", max_retries, 0),
        ):
            if isinstance(value, bool) or not isinstance(value, int) or value < least:
                raise ConfigurationError(
                    f"{name} {arg} must be an integer >= {least}, got {value!r}"
                )
        for arg, seconds in (
            ("send_interval", send_interval),
            ("retry_backoff", retry_backoff),
            ("flush_timeout", flush_timeout),
        ):
            if not isinstance(seconds, (int, float)) or isinstance(seconds, bool) or seconds < 0:
                raise ConfigurationError(f"{name} {arg} must be seconds >= 0, got {seconds!r}")
        # Never consulted: LogReport hands each entry over as it emits it (Pump.put).
        self.trigger = get_trigger(None)
        self._log_report_name = log_report
        self._extra_params = dict(params or {})
        self._artifact_patterns = (artifacts,) if isinstance(artifacts, str) else tuple(artifacts)
        if snapshots:
            pattern = SNAPSHOT_PATTERN if snapshots is True else str(snapshots)
            self._artifact_patterns = (*self._artifact_patterns, pattern)
        self._queue_size = queue_size
        self._batch_size = batch_size
        self._send_interval = float(send_interval)
        self._max_retries = max_retries
        self._retry_backoff = float(retry_backoff)
        self._flush_timeout = float(flush_timeout)
        self._sender_mode = sender
        self._log_report: LogReport | None = None
        self._params: dict[str, Any] = {}
        self._out_dir = "."
        self._process: ProcessSender | None = None
        self._sender_pid: int | None = None
        # Set in a sender process only: reports each count change to the parent.
        self._on_counts: Callable[[], None] | None = None
        # Entries of the LogReport already handed to the queue (or skipped), while it is not
        # listening (then: all it holds); saved in snapshots.
        self._seen = 0
        # Restored from a snapshot: the log index below which every entry had reached the
        # backend when it was taken (the rest is handed over again; last_step skips what the
        # backend got after it). None once the resumed run listens.
        self._confirmed: int | None = None
        self._restored = False
        self._run_id: str | None = None
        self._run_key: str | None = None
        self._active = False
        self._worker: threading.Thread | None = None
        self._reset_run_state()

    def _reset_run_state(self) -> None:
        # Everything one Trainer.run() uses; a second run starts afresh (same run id).
        # The queue and its pump thread (the sender process's, with sender="process").
        self._pump: Pump | None = None
        # The LogReport whose entries are put on the queue as it emits them, and the entries
        # handed over: _handed, plus its num_entries while listening (no count on the
        # training thread).
        self._listening: LogReport | None = None
        self._handed = 0
        # The log index of the first entry handed over in this run (see state_dict).
        self._hand_start = 0
        # Restored while listening (autoload, after initialize): the LogReport waiting for
        # its first entry to hand over the restored backlog (_resume_listening).
        self._pending: LogReport | None = None
        self._abandon = threading.Event()
        self._opened = False
        self._skip_through: int | None = None
        self._run_failed = False
        self._uploaded: set[tuple[str, int, int]] = set()
        self._counts = TrackerReport()
        # Warnings a sender thread found, raised by the training thread (_announce).
        self._notices: list[str] = []
        self._drop_warned = False
        self._failure_warned = False

    # ----------------------------------------------------------------- backend, worker thread

    def open_run(self, run_id: str | None) -> str | None:
        """Starts the tracker run, or resumes ``run_id`` (from a snapshot); returns its id.

        Called once, on the worker thread, before the first batch. Raising counts as a failed
        attempt and is retried like any backend call. When :attr:`resuming` without a
        ``run_id`` (the snapshot was taken before the run opened), look the run up by
        :attr:`run_key`.

        Args:
            run_id: The id :meth:`state_dict` saved, or None for a new run.
        """
        raise NotImplementedError(f"{type(self).__name__} must implement open_run(run_id)")

    def log_metrics(self, entries: Sequence[TrackerEntry]) -> None:
        """Sends a batch of entries (in step order); raising retries the whole batch.

        Args:
            entries: At most ``batch_size`` entries.
        """
        raise NotImplementedError(f"{type(self).__name__} must implement log_metrics(entries)")

    def log_params(self, params: Mapping[str, Any]) -> None:
        """Sends the run's params (:meth:`run_params` and ``params=``), once per run."""

    def last_step(self) -> int | None:
        """The highest step the resumed run already holds, or None when unknown.

        Called after :meth:`open_run` resumed a run; entries at or below it are skipped, so a
        run resumed from an older snapshot logs no step twice.
        """
        return None

    def log_artifact(self, path: str) -> None:
        """Uploads ``path`` (one matching ``artifacts=``): a file, or the directory of a
        complete ``SnapshotMode.DCP`` snapshot (uploaded whole, under its name)."""
        raise NotImplementedError(f"{type(self).__name__} does not upload artifacts")

    def close_run(self, failed: bool) -> None:
        """Ends the run; ``failed`` when training raised. Called once, without retries."""

    # ------------------------------------------------------------- training thread, cheap

    def run_params(self, manager: ManagerView) -> dict[str, Any]:
        """The run's params, read from the manager once when training starts.

        The optimizers' classes and hyperparameters (``optimizer/<name>/<key>``; groups
        after the first as ``optimizer/<name>/group<i>/<key>``), ``max_epochs``,
        ``iters_per_epoch``, each model's runtime and device (``runtime/<name>``,
        ``device/<name>``) and the ppe-core and torch versions. Runs on the training thread:
        it must not touch the network.
        """
        import torch

        params: dict[str, Any] = {}
        for name, optimizer in manager.optimizers.items():
            prefix = f"optimizer/{name}/"
            params[prefix + "class"] = type(optimizer).__name__
            for index, group in enumerate(optimizer.param_groups):
                group_prefix = prefix if index == 0 else f"{prefix}group{index}/"
                for key, value in group.items():
                    if key == "params":
                        continue
                    if isinstance(value, tuple) and all(isinstance(v, _PARAM_TYPES) for v in value):
                        params[group_prefix + key] = list(value)
                    elif isinstance(value, _PARAM_TYPES):
                        params[group_prefix + key] = value
        max_epochs = getattr(manager, "max_epochs", None)
        if max_epochs is not None:
            params["max_epochs"] = max_epochs
        params["iters_per_epoch"] = manager.iters_per_epoch
        for name, model in manager.models.items():
            runtime = get_runtime(model)
            if runtime is not None:
                params[f"runtime/{name}"] = type(runtime).__name__
                params[f"device/{name}"] = str(runtime.device_spec)
        params["ppe_core_version"] = __version__
        params["torch_version"] = torch.__version__
        params["world_size"] = group_world()[0]
        return params

    @property
    def collectives(self) -> str | None:
        """What the tracker issues under torch.distributed (see ``training/_ranks``): with
        artifacts, the check at start that rank 0 sees every rank's DCP shards."""
        if not self._artifact_patterns:
            return None
        return f"tracker(shared out_dir check, artifacts={list(self._artifact_patterns)})"

    @property
    def run_id(self) -> str | None:
        """The tracker run's id: None until the worker opened (or was told to resume) one."""
        return self._run_id

    @property
    def run_key(self) -> str | None:
        """A key made up when training first starts, kept in snapshots with :attr:`run_id`.

        A snapshot taken before the worker opened the run (the backend was still starting
        or unreachable) has no run id; a backend that cannot choose its run ids tags the run
        with this key, so that :meth:`open_run` of a resumed training finds it by the key
        (one that can, W&B, uses the key as the id).
        """
        return self._run_key

    @property
    def sender(self) -> str:
        """Where the backend methods run: ``"thread"`` or ``"process"`` (the mode asked
        for, or the thread a tracker that cannot run in a process fell back to)."""
        return self._sender_mode

    @property
    def sender_pid(self) -> int | None:
        """The sender process's pid (the latest run's), or None on a thread."""
        return self._sender_pid

    @property
    def resuming(self) -> bool:
        """Whether this training resumed from a snapshot of this tracker."""
        return self._restored

    @property
    def report(self) -> TrackerReport:
        """The counts so far (final once :meth:`finalize` returned)."""
        pump = self._pump
        if pump is None:
            return self._counts
        handed = self._handed_count()
        dropped = pump.dropped(handed)
        return dataclasses.replace(self._counts, queued=handed - dropped, dropped=dropped)

    def _resolve(self, manager: ManagerView) -> LogReport:
        if self._log_report is None:
            self._log_report = find_log_report(manager, self._log_report_name, type(self).__name__)
        return self._log_report

    def initialize(self, manager: ManagerView) -> None:
        """Finds the LogReport, reads the run's params and starts the pump and the worker.

        Entries the LogReport already holds (restored from an earlier run) are not sent
        again. Nothing here touches the network: the run opens on the worker.
        """
        log_report = self._resolve(manager)
        self._stop_listening()  # an earlier run's, ended without finalize
        if not self._restored:
            self._seen = log_report.num_entries
        if self._run_key is None:
            self._run_key = uuid.uuid4().hex
        self._reset_run_state()
        # Every rank, before rank 0 alone goes on: refuses DCP uploads missing other nodes' shards.
        check_shared_out_dir(manager, self.name, self._label(), self._artifact_patterns)
        self._active = group_world()[1] == 0
        if not self._active:
            return
        self._params = {**self.run_params(manager), **self._extra_params}
        self._out_dir = manager.out
        self._process = self._sender_pid = None
        if self._sender_mode == "process":
            reason = unsendable_reason(self)
            if not reason:
                self._process = ProcessSender(
                    self,
                    self._label(),
                    capacity=self._queue_size,
                    batch_size=self._batch_size,
                    interval=self._send_interval,
                    on_report=self._take_sender_report,
                    on_full=self._check_drops,
                )
                self._sender_pid = self._process.pid
                self._start_listening(log_report, self._process.pump)
                return
            self._sender_mode = "thread"
            warnings.warn(
                f"{self._label()} sends from a thread, not a sender process: {reason}. Move "
                "the class to an importable module and keep its constructor's arguments "
                'picklable, or pass sender="thread" to choose the thread',
                TrackerWarning,
                stacklevel=2,
            )
        feed = self.start_worker()
        pump = Pump(
            capacity=self._queue_size,
            batch_size=self._batch_size,
            interval=self._send_interval,
            deliver=feed,
            finished=self._finished_count,
            on_full=self._check_drops,
            name=f"ppe-tracker-{self._label()}-pump",
        )
        self._start_listening(log_report, pump)

    def __call__(self, manager: ManagerView) -> None:
        """Does nothing: LogReport hands each entry over as it emits it.

        Training never calls it (its trigger never fires); calling it by hand is harmless.
        """

    def _start_listening(self, log_report: LogReport, pump: Pump) -> None:
        # The backlog first (a resumed run's entries that had not reached the backend when
        # its snapshot was taken), then every entry as LogReport emits it: each one past the
        # `start` first ones is handed over. A sender thread reading the count in between
        # (_handed_count) gets fewer, never more.
        self._pump = pump
        start = self._backlog_start(log_report)
        self._handed = pump.taken + len(pump.items) - start  # what an earlier listen put
        self._hand_start = start
        for entry in log_report.entries_since(start):
            pump.put(entry)
        self._listening = log_report
        log_report.add_entry_listener(pump.put)

    def _backlog_start(self, log_report: LogReport) -> int:
        # Where the entries handed over start: after those seen, or for a resumed run after
        # those its snapshot knew had reached the backend (at most a full queue before the
        # end: older ones would only push each other out).
        count = log_report.num_entries
        start = min(self._seen, count)
        confirmed, self._confirmed = self._confirmed, None
        if confirmed is not None:
            start = min(start, max(confirmed, count - self._queue_size, 0))
        return max(start, 0)

    def _resume_listening(self, entry: Mapping[str, Any]) -> None:
        # A one-shot listener: the first entry after a restore while listening (autoload
        # restores after initialize). The restored log is complete now: hand over what its
        # backend may lack, this entry included, then listen as usual.
        log_report, pump = self._pending, self._pump
        self._pending = None
        if log_report is None or pump is None:
            return
        log_report.remove_entry_listener(self._resume_listening)
        self._start_listening(log_report, pump)

    def _stop_listening(self) -> None:
        pending = self._pending
        if pending is not None:  # restored, and no entry since: the backlog still goes
            self._resume_listening({})
        log_report, pump = self._listening, self._pump
        if log_report is None or pump is None:
            return
        self._listening = None
        log_report.remove_entry_listener(pump.put)
        self._seen = log_report.num_entries
        self._handed += log_report.num_entries

    def _handed_count(self) -> int:
        # Entries handed to the queue: exact on the training thread, never over elsewhere.
        handed = self._handed
        log_report = self._listening
        return handed if log_report is None else handed + log_report.num_entries

    def _finished_count(self) -> int:
        counts = self._counts
        return counts.sent + counts.failed + counts.skipped

    def _check_drops(self) -> None:
        # The pump found the queue full: entries are dropped once one was pushed out.
        pump = self._pump
        if self._drop_warned or pump is None or not pump.dropped(self._handed_count()):
            return
        self._drop_warned = True
        self._announce(
            f"{self._label()}'s queue is full ({self._queue_size} entries: the backend is "
            "slower than LogReport emits, or unreachable); each new entry drops the oldest "
            "waiting one until it drains, and the number dropped is reported when training ends"
        )

    def _announce(self, message: str) -> None:
        # From a sender thread: the warning is raised on the training thread, by a one-shot
        # listener at LogReport's next entry (raised on a sender thread it would name no line
        # of the user's, and with warnings as errors stop that thread). At the end of
        # training finalize's warning counts everything instead.
        with _NOTICES_LOCK:
            log_report = self._listening
            if log_report is None:
                return
            self._notices.append(message)
            log_report.add_entry_listener(self._raise_notices)

    def _raise_notices(self, entry: Mapping[str, Any]) -> None:
        with _NOTICES_LOCK:
            notices, self._notices = self._notices, []
            if self._log_report is not None:
                self._log_report.remove_entry_listener(self._raise_notices)
        for message in notices:
            warnings.warn(message, TrackerWarning, stacklevel=3)

    def on_error(
        self, manager: ManagerView, exc: BaseException, tb: types.TracebackType | None
    ) -> None:
        """Marks the run as failed; :meth:`finalize` still flushes what is queued."""
        self._run_failed = True

    def finalize(self, manager: ManagerView) -> None:
        """Sends what is queued, waiting up to ``flush_timeout`` seconds for the worker.

        Warns with a :class:`TrackerWarning` counting every entry that did not reach the
        backend (dropped, refused, or still queued when the wait ran out); the worker of a
        timed-out flush is abandoned (a daemon thread, it does not keep the process alive).
        """
        worker, process, pump = self._worker, self._process, self._pump
        if (worker is None and process is None) or pump is None:
            return
        self._process = None
        self._stop_listening()
        with _NOTICES_LOCK:  # this warning counts what they would have said
            self._notices.clear()
            if self._log_report is not None:
                self._log_report.remove_entry_listener(self._raise_notices)
        deadline = time.monotonic() + self._flush_timeout
        if self._artifact_patterns:
            # A snapshot of the last iteration may still be on a background writer (extensions
            # finalize before the writers): the worker's last look for artifacts comes after it.
            _wait_for_writers(manager, self._flush_timeout)
        remaining = max(0.0, deadline - time.monotonic())
        if process is not None:
            timed_out = process.finish(self._run_failed, remaining)
        else:
            pump.close()  # hands the worker what waits, then the end (never blocks)
            pump.join(remaining)
            timed_out = self.stop_worker(max(0.0, deadline - time.monotonic()))
        counts = self.report
        unsent = counts.queued - counts.sent - counts.failed - counts.skipped
        self._update(unsent=unsent, timed_out=timed_out)
        counts = self.report
        if counts.dropped or counts.failed or unsent or not counts.params_sent:
            parts = []
            if counts.dropped:
                parts.append(f"{counts.dropped} dropped because the queue was full")
            if counts.failed:
                parts.append(f"{counts.failed} refused after {self._max_retries} retries")
            if unsent:
                parts.append(
                    f"{unsent} still queued when the flush gave up after {self._flush_timeout:g} s"
                    if timed_out
                    else f"{unsent} not sent"
                )
            lost = counts.dropped + counts.failed + unsent
            message = (
                f"{self._label()} sent {counts.sent} of {counts.queued + counts.dropped} entries "
                f"to run {self._run_id!r}; {lost} did not reach it"
            )
            if parts:
                message += " (" + ", ".join(parts) + ")"
            if not counts.params_sent:
                message += "; the run's params were not sent"
            if counts.last_error:
                message += f"; last error: {counts.last_error}"
            warnings.warn(message, TrackerWarning, stacklevel=2)

    def __getstate__(self) -> dict[str, Any]:
        """The tracker without its runtime state (queue, threads, LogReport, counts): what a
        sender process is rebuilt from. Subclasses leave out their clients the same way."""
        state = self.__dict__.copy()
        for key in _RUNTIME_STATE:
            state.pop(key, None)
        return state

    def __setstate__(self, state: Mapping[str, Any]) -> None:
        self.__dict__.update(state)
        self.trigger = get_trigger(None)
        self._log_report = None
        self._worker = None
        self._process = None
        self._on_counts = None
        self._reset_run_state()

    def state_dict(self) -> dict[str, Any]:
        """The run id and key, how many LogReport entries were already handed over, and how
        many had reached the backend (``entries_confirmed``): a run resumed from this state
        hands the others over again (the snapshot holds them in LogReport's log; the entries
        the backend got after this state was taken are skipped, see :meth:`last_step`)."""
        seen = self._seen
        confirmed = self._seen if self._confirmed is None else self._confirmed
        if self._listening is not None:
            seen = self._listening.num_entries  # each one was handed over as it was emitted
            counts = self._counts
            # Handed over in log order: the first sent or skipped ones reached the backend.
            confirmed = min(seen, self._hand_start + counts.sent + counts.skipped)
        elif not self._active and self._log_report is not None:
            seen = self._log_report.num_entries  # off rank 0 nothing is handed over: all seen
            confirmed = seen
        return {
            "run_id": self._run_id,
            "run_key": self._run_key,
            "entries_seen": seen,
            "entries_confirmed": confirmed,
        }

    def load_state_dict(self, to_load: Mapping[str, Any]) -> None:
        """Restores :meth:`state_dict`: the next run resumes that tracker run."""
        run_id = to_load.get("run_id")
        self._run_id = None if run_id is None else str(run_id)
        run_key = to_load.get("run_key")
        self._run_key = None if run_key is None else str(run_key)
        if "entries_seen" in to_load:
            self._seen = int(to_load["entries_seen"])
            self._confirmed = int(to_load.get("entries_confirmed", self._seen))
            self._restored = True
            log_report, pump = self._listening, self._pump
            if log_report is not None and pump is not None:
                # Restored after initialize (autoload): LogReport's log is replaced too,
                # maybe only after this. Its first entry hands the backlog over; until then
                # nothing is listening, and what was put so far stays counted.
                log_report.remove_entry_listener(pump.put)
                self._listening = None
                self._handed = pump.taken + len(pump.items)
                self._pending = log_report
                log_report.add_entry_listener(self._resume_listening)

    # ----------------------------------------------------------------------- the worker

    # The sending worker's controls: the thread mode's, and a sender process's child runs the
    # same worker through them (``_child``), so neither reaches into the tracker's fields.

    def start_worker(
        self, *, on_counts: Callable[[], None] | None = None
    ) -> Callable[[list[Mapping[str, Any]] | None], None]:
        """Starts the sending worker; returns what hands it a batch (``None``: no more).

        Args:
            on_counts: Called after every change of :attr:`report` (the child reports it).
        """
        batches: queue.SimpleQueue[list[Mapping[str, Any]] | None] = queue.SimpleQueue()
        self._on_counts = on_counts
        self._worker = threading.Thread(
            target=self._work, args=(batches.get,), name=f"ppe-tracker-{self._label()}", daemon=True
        )
        self._worker.start()
        return batches.put

    def stop_worker(
        self, timeout: float | None, *, failed: bool | None = None, grace: float = 0.0
    ) -> bool:
        """Waits for the worker, handed its last batch and ``None``, to send them, close the
        run and stop; True when it was still sending after ``timeout`` seconds and was
        abandoned (given ``grace`` more seconds to close the run).

        Args:
            timeout: Seconds to wait for the batches to be sent (None: as long as it takes).
            failed: Whether the run failed, when known here (the child learns it last).
            grace: Seconds an abandoned worker gets to close the run.
        """
        if failed is not None:
            self._run_failed = failed
        worker, self._worker = self._worker, None
        if worker is None:
            return False
        worker.join(timeout)
        if not worker.is_alive():
            return False
        self._abandon.set()
        worker.join(grace)
        return True

    def _take_sender_report(self, counts: TrackerReport, run_id: str | None) -> None:
        # A sender process's counts (its entries lost in the pipe counted as failed); what
        # only the parent knows (unsent, timed_out) is kept.
        with _COUNTS_LOCK:
            current = self._counts
            self._counts = dataclasses.replace(
                counts, unsent=current.unsent, timed_out=current.timed_out
            )
            if run_id is not None:
                self._run_id = run_id
        self._check_failures()

    def _label(self) -> str:
        return self.name or type(self).__name__

    def _update(self, **changes: Any) -> None:
        # One immutable report replaced whole, under a lock (both threads count): readers
        # always see a consistent one.
        with _COUNTS_LOCK:
            self._counts = dataclasses.replace(self._counts, **changes)
        if self._on_counts is not None:
            self._on_counts()

    def _add(self, **deltas: int) -> None:
        with _COUNTS_LOCK:
            current = self._counts
            changes = {key: getattr(current, key) + delta for key, delta in deltas.items()}
            self._counts = dataclasses.replace(current, **changes)
        if self._on_counts is not None:
            self._on_counts()
        if "failed" in deltas:
            self._check_failures()

    def _check_failures(self) -> None:
        counts = self._counts
        if counts.failed and not self._failure_warned:
            self._failure_warned = True
            self._announce(
                f"{self._label()} could not send {counts.failed} entries after "
                f"{self._max_retries} retries ({counts.last_error}); training goes on, later "
                "entries are still tried, and the total is reported when training ends"
            )

    def _work(self, take: Callable[[], list[Mapping[str, Any]] | None]) -> None:
        try:
            while not self._abandon.is_set():
                batch = take()
                if batch is None:
                    break
                self._send_batch(batch)
                self._send_artifacts()
            if not self._abandon.is_set():
                if not self._opened:  # a run without entries still gets its params
                    self._attempt(lambda: None)
                self._send_artifacts()
        except Exception as exc:  # the worker never dies with an unreported error
            self._update(last_error=_describe(exc))
        finally:
            if self._opened:
                try:
                    self.close_run(self._run_failed)
                except Exception as exc:
                    self._update(last_error=_describe(exc))

    def _open(self) -> None:
        resumed = self._run_id is not None or self._restored
        self._run_id = self.open_run(self._run_id)
        self._opened = True
        if resumed:
            try:
                self._skip_through = self.last_step()
            except Exception as exc:  # unknown: nothing is skipped
                self._update(last_error=_describe(exc))
        # Params failing (a tracker refusing a changed value on resume) never stop metrics.
        sent = self._retrying(lambda: self.log_params(self._params), opening=False)
        self._update(params_sent=sent)

    def _send_batch(self, batch: Sequence[Mapping[str, Any]]) -> None:
        entries = [_to_entry(entry) for entry in batch]

        def send() -> None:
            skip = self._skip_through
            todo = entries if skip is None else [e for e in entries if e.step > skip]
            if todo:
                self.log_metrics(todo)
            self._add(sent=len(todo), skipped=len(entries) - len(todo))

        if not self._attempt(send):
            self._add(failed=len(entries))

    def _attempt(self, action: Callable[[], object]) -> bool:
        return self._retrying(action, opening=True)

    def _retrying(self, action: Callable[[], object], *, opening: bool) -> bool:
        delay = self._retry_backoff
        for attempt in range(self._max_retries + 1):
            if self._abandon.is_set():
                return False
            try:
                if opening and not self._opened:
                    self._open()
                action()
                return True
            except Exception as exc:
                self._update(last_error=_describe(exc))
                if attempt == self._max_retries or self._abandon.wait(delay):
                    return False
                delay = min(delay * 2, _MAX_BACKOFF)
        return False

    def _send_artifacts(self) -> None:
        if not self._artifact_patterns or not self._opened:
            return
        for pattern in self._artifact_patterns:
            for path in sorted(glob.glob(os.path.join(self._out_dir, pattern))):
                # A SnapshotMode.DCP snapshot is a directory, renamed into place once complete
                # (with its manifest, written last): uploaded whole, once per save.
                is_dir = os.path.isdir(path)
                try:
                    stat = os.stat(os.path.join(path, _DCP_MANIFEST) if is_dir else path)
                except OSError:
                    continue
                key = (path, stat.st_size, stat.st_mtime_ns)
                if key in self._uploaded or not (is_dir or os.path.isfile(path)):
                    continue
                if self._retrying(functools.partial(self.log_artifact, path), opening=False):
                    self._uploaded.add(key)
                    self._add(artifacts_sent=1)


def _wait_for_writers(manager: ManagerView, timeout: float) -> None:
    """Waits up to ``timeout`` seconds for the saves queued on the background writers of
    ``manager`` and its extensions (a no-op job submitted after them is done); a writer that
    failed or was finalized is left to its owner to report."""
    writers: dict[int, Writer] = {}
    for candidate in (
        getattr(manager, "writer", None),
        *(getattr(ext, "writer", None) for ext in _extensions(manager)),
    ):
        if isinstance(candidate, Writer) and candidate.in_background:
            writers[id(candidate)] = candidate
    deadline = time.monotonic() + timeout
    for writer in writers.values():
        try:
            writer.submit(_nothing).result(max(0.0, deadline - time.monotonic()))
        except Exception:  # failed, finalized or timed out: the snapshot reports its own
            continue


def _extensions(manager: ManagerView) -> list[Any]:
    entries = getattr(manager, "extensions", ())
    return [getattr(entry, "extension", None) for _, entry in entries]


def _nothing() -> None:
    return None


def _to_entry(entry: Mapping[str, Any]) -> TrackerEntry:
    metrics = {
        key: float(value)
        for key, value in entry.items()
        if isinstance(value, (int, float)) and not isinstance(value, bool)
    }
    return TrackerEntry(step=int(entry.get("iteration", 0)), metrics=metrics)


def _describe(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"[:300]
