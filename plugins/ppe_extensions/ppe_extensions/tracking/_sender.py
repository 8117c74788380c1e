"""The sender process: a tracker's backend calls in a child process, off the training GIL.

The parent (:class:`ProcessSender`) starts ``python -m ppe_extensions.tracking._child`` with
pipes, never re-running the user's script (no multiprocessing spawn) and never forking a
process that holds torch's threads. Messages are length-prefixed pickles:

* parent -> child (stdin): ``("start", sys_path, tracker_pickle)`` once, then
  ``("batch", entries)`` per batch and ``("close", failed)`` at the end. EOF without
  ``close`` means the parent died: the child gives its worker a few seconds and exits.
* child -> parent (stdout): ``("counts", report, run_id)`` (a :class:`TrackerReport`)
  whenever a count changes, and ``("done",)`` after
  the run closed. The child's own stdout goes to its stderr, which the parent forwards to
  its ``sys.stderr`` and keeps the tail of for its report.

The child rebuilds the tracker from the pickle (``BaseTracker.__getstate__`` leaves the
runtime state out) and runs the same worker as the thread mode: retries, skips on resume,
artifacts and ``close_run`` behave alike. Neither side touches the tracker's fields: the
parent reports through the callbacks the tracker hands it, the child drives the worker
through ``BaseTracker.start_worker``/``stop_worker`` and reads ``report`` and ``run_id``.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import os
import pickle
import subprocess
import sys
import threading
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from ppe_extensions.tracking._channel import Pump, TrackerReport, read_message, write_message

if TYPE_CHECKING:
    from ppe_extensions.tracking._tracker import BaseTracker

__all__ = ["ProcessSender", "unsendable_reason"]

# Lines of the child's stderr kept for the report of a sender that died.
_STDERR_TAIL = 20


def unsendable_reason(tracker: BaseTracker) -> str:
    """Why ``tracker`` cannot be rebuilt in a sender process; empty when it can."""
    cls = type(tracker)
    if cls.__module__ == "__main__" or "<locals>" in cls.__qualname__:
        where = "the script's __main__" if cls.__module__ == "__main__" else "a function"
        return (
            f"its class {cls.__qualname__} is defined in {where}, which the sender process "
            "cannot import (it never re-runs the script)"
        )
    try:
        pickle.dumps(tracker, protocol=pickle.HIGHEST_PROTOCOL)
    except Exception as exc:
        return f"it cannot be pickled ({type(exc).__name__}: {exc})"
    return ""


class ProcessSender:
    """The parent's end of a sender process: hands entries over in batches, reads counts.

    The training thread puts entries into :attr:`pump`'s queue (its ``put`` is LogReport's
    entry listener); the pump thread pickles each batch once and writes it to the child's
    stdin, keeping at most two batches unfinished in the child; a reader thread applies the
    child's counts to the tracker, and a third forwards the child's stderr.
    """

    def __init__(
        self,
        tracker: BaseTracker,
        label: str,
        *,
        capacity: int,
        batch_size: int,
        interval: float,
        on_report: Callable[[TrackerReport, str | None], None],
        on_full: Callable[[], None],
    ) -> None:
        self._tracker = tracker
        self._on_report = on_report
        self._error: str | None = None  # what went wrong on this side (under _counts_lock)
        self._child_report = TrackerReport()
        self._counts_lock = threading.Lock()
        self._run_id: str | None = None
        self._done = 0  # reader only: entries the child sent, refused or skipped
        self._orphaned = 0  # pump only: entries it could not hand to the child
        self._started = self._broken = False  # pump only
        self._close_failed = False
        self._finished = False
        self._ended = threading.Event()
        self._stderr_done = threading.Event()
        self._stderr_tail: collections.deque[str] = collections.deque(maxlen=_STDERR_TAIL)
        self._label = label
        root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
        self.process = subprocess.Popen(
            [sys.executable, "-m", "ppe_extensions.tracking._child"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
            close_fds=True,
            # Its own session: a scheduler's or Ctrl-C's signal to the trainer's process group
            # does not kill it while it starts (before it ignores them itself, in main()); the
            # trainer flushes through it after the signal, and its pipe's EOF ends it.
            start_new_session=True,
        )
        self._threads = [
            threading.Thread(target=target, name=f"ppe-tracker-{label}-{role}", daemon=True)
            for target, role in ((self._read_counts, "reader"), (self._forward_stderr, "stderr"))
        ]
        for thread in self._threads:
            thread.start()
        self.pump = Pump(
            capacity=capacity,
            batch_size=batch_size,
            interval=interval,
            deliver=self._deliver,
            finished=self._settled,
            on_full=on_full,
            name=f"ppe-tracker-{label}-pump",
        )

    @property
    def pid(self) -> int:
        return self.process.pid

    def finish(self, failed: bool, timeout: float) -> bool:
        """Sends what is left and closes the run; True when the child was killed after
        ``timeout`` seconds (what it had not sent counts as unsent)."""
        self._close_failed = failed
        self.pump.close()
        timed_out = not self._ended.wait(timeout)
        if timed_out:
            self.process.kill()
            self._ended.wait(10)
        self.pump.join(1)
        for thread in self._threads:
            thread.join(1)
        return timed_out

    # ------------------------------------------------------------------ parent threads

    def _settled(self) -> int:
        # Entries handed to the child that it finished (sent, refused, skipped) or never got;
        # once it exited, all: what comes next fails at once (counted), never waits to drop.
        if self._ended.is_set():
            return self.pump.taken
        return self._done + self._orphaned

    def _deliver(self, batch: list[Mapping[str, Any]] | None) -> None:
        # The pump thread's: a batch, or None for the end of the run.
        stdin = self.process.stdin
        assert stdin is not None
        if not self._started:
            # The tracker is pickled when its first batch (or the end) comes, not when it
            # initializes: a snapshot autoloaded after that (run id, steps) is in it.
            self._started = True
            try:
                payload = pickle.dumps(self._tracker, protocol=pickle.HIGHEST_PROTOCOL)
                write_message(stdin, ("start", list(sys.path), payload))
            except Exception as exc:
                self._broken = True
                self._fail(f"{type(exc).__name__}: {exc}")
        if batch is None:
            with contextlib.suppress(OSError):
                if not self._broken:
                    write_message(stdin, ("close", self._close_failed))
                stdin.close()
            return
        if not self._broken:
            try:
                write_message(stdin, ("batch", batch))
                return
            except OSError:
                self._broken = True
            except Exception as exc:  # an entry that cannot be pickled: this batch fails
                reason = f"{type(exc).__name__}: {exc}"
                self._fail(f"a batch could not be handed to the sender process: {reason}")
        self._orphan(len(batch))

    def _fail(self, message: str) -> None:
        with self._counts_lock:
            self._error = message[:300]
            self._report()

    def _orphan(self, count: int) -> None:
        with self._counts_lock:
            self._orphaned += count
            self._report()

    def _report(self) -> None:
        # Under _counts_lock (the pump and the reader both report, one at a time, so an older
        # report never overwrites a newer one): the child's counts, with the entries it never
        # got as failed and this side's error (the child's death) before the child's last.
        child = self._child_report
        counts = dataclasses.replace(
            child,
            failed=child.failed + self._orphaned,
            last_error=self._error or child.last_error,
        )
        self._on_report(counts, self._run_id)

    def _read_counts(self) -> None:
        stdout = self.process.stdout
        assert stdout is not None
        try:
            while True:
                message = read_message(stdout)
                if message is None:
                    break
                if message[0] == "done":
                    self._finished = True
                elif message[0] == "counts":
                    _, child, run_id = message
                    if not isinstance(child, TrackerReport):
                        raise TypeError(f"a sender process reported {type(child).__name__}")
                    with self._counts_lock:
                        self._child_report = child
                        if run_id is not None:
                            self._run_id = str(run_id)
                        self._report()
                        self._done = child.sent + child.failed + child.skipped
        except Exception as exc:  # a garbled message: the child is no use any more
            self.process.kill()
            self._fail(f"{type(exc).__name__}: {exc}")
        stdout.close()
        code = self.process.wait()
        if not self._finished:
            self._stderr_done.wait(5)
            tail = [line for line in self._stderr_tail if line.strip()]
            detail = f": {tail[-1].strip()}" if tail else ""
            self._fail(f"the sender process exited with code {code}{detail}")
        self._ended.set()

    def _forward_stderr(self) -> None:
        stderr = self.process.stderr
        assert stderr is not None
        try:
            for raw in stderr:
                line = raw.decode("utf-8", "replace")
                self._stderr_tail.append(line)
                # A closed or replaced stderr: the tail is still kept.
                with contextlib.suppress(Exception):
                    sys.stderr.write(line)
        finally:
            stderr.close()
            self._stderr_done.set()
