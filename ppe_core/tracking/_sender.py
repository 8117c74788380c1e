"""The sender process: a tracker's backend calls in a child process, off the training GIL.

The parent (:class:`ProcessSender`) starts ``python -m ppe_core.tracking._child`` with
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
parent reports through the two callbacks the tracker hands it, the child drives the worker
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
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from ppe_core.tracking._channel import TrackerReport, read_message, write_message

if TYPE_CHECKING:
    from ppe_core.tracking._tracker import BaseTracker

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

    :meth:`offer` runs on the training thread and only appends to a deque (no lock, no
    pickling); a pump thread pickles each batch once and writes it to the child's stdin, a
    reader thread applies the child's counts to the tracker, and a third forwards the
    child's stderr.
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
        on_error: Callable[[str], None],
    ) -> None:
        self._tracker = tracker
        self._capacity = capacity
        self._batch_size = batch_size
        self._interval = interval
        self._on_report = on_report
        self._on_error = on_error
        self._child_report = TrackerReport()
        self._counts_lock = threading.Lock()
        self._run_id: str | None = None
        self._items: collections.deque[Mapping[str, Any]] = collections.deque()
        self._wake = threading.Event()
        self._offered = 0  # training thread only
        self._done = 0  # reader only: entries the child sent, refused or skipped
        self._orphaned = 0  # pump only: entries it could not hand to the child
        self._closing = False
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
            [sys.executable, "-m", "ppe_core.tracking._child"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
            close_fds=True,
        )
        self._threads = [
            threading.Thread(target=target, name=f"ppe-tracker-{label}-{role}", daemon=True)
            for target, role in (
                (self._pump, "pump"),
                (self._read_counts, "reader"),
                (self._forward_stderr, "stderr"),
            )
        ]
        for thread in self._threads:
            thread.start()

    @property
    def pid(self) -> int:
        return self.process.pid

    def offer(self, item: Mapping[str, Any]) -> bool:
        """Appends ``item`` unless ``queue_size`` entries are unsent (False); never waits."""
        if self._offered - self._done - self._orphaned >= self._capacity:
            return False
        self._offered += 1
        items = self._items
        items.append(item)
        count = len(items)
        if count == 1 or count == self._batch_size:
            self._wake.set()
        return True

    def finish(self, failed: bool, timeout: float) -> bool:
        """Sends what is left and closes the run; True when the child was killed after
        ``timeout`` seconds (what it had not sent counts as unsent)."""
        self._close_failed = failed
        self._closing = True
        self._wake.set()
        timed_out = not self._ended.wait(timeout)
        if timed_out:
            self.process.kill()
            self._ended.wait(10)
        for thread in self._threads:
            thread.join(1)
        return timed_out

    # ------------------------------------------------------------------ parent threads

    def _pump(self) -> None:
        stdin = self.process.stdin
        assert stdin is not None
        broken = started = False
        items = self._items
        while True:
            self._wake.wait()
            if not started:
                # The tracker is pickled when its first entry (or the end) comes, not when it
                # initializes: a snapshot autoloaded after that (run id, steps) is in it.
                started = True
                try:
                    payload = pickle.dumps(self._tracker, protocol=pickle.HIGHEST_PROTOCOL)
                    write_message(stdin, ("start", list(sys.path), payload))
                except Exception as exc:
                    broken = True
                    self._on_error(f"{type(exc).__name__}: {exc}")
            deadline = time.monotonic() + self._interval
            while not self._closing and len(items) < self._batch_size:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                self._wake.clear()
                if self._closing or len(items) >= self._batch_size:
                    break
                self._wake.wait(remaining)
            self._wake.clear()
            while items:
                batch = [items.popleft() for _ in range(min(self._batch_size, len(items)))]
                if not broken:
                    try:
                        write_message(stdin, ("batch", batch))
                        continue
                    except OSError:
                        broken = True
                self._orphan(len(batch))
            if self._closing and not items:
                break
        try:
            if not broken:
                write_message(stdin, ("close", self._close_failed))
            stdin.close()
        except OSError:
            pass

    def _orphan(self, count: int) -> None:
        with self._counts_lock:
            self._orphaned += count
            self._report()

    def _report(self) -> None:
        # Under _counts_lock (the pump and the reader both report, one at a time, so an older
        # report never overwrites a newer one): the child's counts, with the entries it never
        # got as failed.
        child = self._child_report
        counts = dataclasses.replace(child, failed=child.failed + self._orphaned)
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
            self._on_error(f"{type(exc).__name__}: {exc}")
        stdout.close()
        code = self.process.wait()
        if not self._finished:
            self._stderr_done.wait(5)
            tail = [line for line in self._stderr_tail if line.strip()]
            detail = f": {tail[-1].strip()}" if tail else ""
            self._on_error(f"the sender process exited with code {code}{detail}")
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
