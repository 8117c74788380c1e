"""What a tracker's training side, its sending worker and its sender process share: the
outbox between the training thread and the sender, the counts and their lock, and the framing
of the messages on the sender process's pipes.

The bottom of ``ppe_core.tracking``: it imports no other tracking module, so the tracker,
the parent's :class:`~ppe_core.tracking._sender.ProcessSender` and the child's loop
(``_child``) all build on it without an import circle.
"""

from __future__ import annotations

import dataclasses
import pickle
import struct
import threading
import time
from collections import deque
from collections.abc import Mapping
from typing import IO, Any

__all__ = ["COUNTS_LOCK", "Outbox", "TrackerReport", "read_message", "write_message"]

# Counts are updated by the training thread and the workers; updates are rare (per entry).
COUNTS_LOCK = threading.Lock()

_HEADER = struct.Struct("!I")


@dataclasses.dataclass(frozen=True)
class TrackerReport:
    """What a tracker did with the entries LogReport emitted (:attr:`BaseTracker.report`).

    ``queued == sent + failed + skipped + unsent``; ``dropped`` entries never entered the
    queue.

    Attributes:
        queued: Entries put on the queue.
        sent: Entries the backend accepted.
        dropped: Entries dropped because the queue was full.
        failed: Entries the backend refused after every retry.
        skipped: Entries at or below the last step a resumed run already held (no duplicates).
        unsent: Entries still queued or in flight (when the final flush timed out).
        params_sent: Whether the run's params reached the backend.
        artifacts_sent: Files uploaded as artifacts.
        last_error: The last backend error, as ``"Type: message"``.
        timed_out: Whether the final flush gave up after ``flush_timeout`` seconds.
    """

    queued: int = 0
    sent: int = 0
    dropped: int = 0
    failed: int = 0
    skipped: int = 0
    unsent: int = 0
    params_sent: bool = False
    artifacts_sent: int = 0
    last_error: str | None = None
    timed_out: bool = False


class Outbox:
    """A bounded queue of LogReport entries between the training thread and the worker.

    ``offer`` never waits: it answers False when the queue is full. It wakes the worker only
    for the first entry of a batch and for a full batch, so the worker (and the GIL it takes)
    runs once per batch, not once per entry.
    """

    def __init__(self, capacity: int, batch_size: int, interval: float) -> None:
        self._capacity = capacity
        self._batch_size = batch_size
        self._interval = interval
        self._items: deque[Mapping[str, Any]] = deque()
        # The condition's own lock, taken directly by `offer`: a Condition's `with` runs two
        # Python-level methods around the lock's C-level ones, on the training thread.
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._closed = False

    def offer(self, item: Mapping[str, Any]) -> bool:
        """Appends ``item`` unless the queue is full (False); never waits for the worker."""
        items = self._items
        with self._lock:
            count = len(items)
            if count >= self._capacity:
                return False
            items.append(item)
            if count == 0 or count + 1 == self._batch_size:
                self._cond.notify()  # the lock is held: a waiting worker cannot miss it
            return True

    def take(self) -> list[Mapping[str, Any]] | None:
        """The next batch: ``batch_size`` entries, or those ``interval`` seconds after the
        first one arrived, or all that is left once closed; None once closed and empty."""
        with self._cond:
            while not self._items and not self._closed:
                self._cond.wait()
            deadline = time.monotonic() + self._interval
            while not self._closed and len(self._items) < self._batch_size:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                self._cond.wait(remaining)
            if not self._items:
                return None
            count = min(self._batch_size, len(self._items))
            return [self._items.popleft() for _ in range(count)]

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    def __len__(self) -> int:
        return len(self._items)


def write_message(stream: IO[bytes], message: tuple[Any, ...]) -> None:
    data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    stream.write(_HEADER.pack(len(data)) + data)
    stream.flush()


def read_message(stream: IO[bytes]) -> tuple[Any, ...] | None:
    """The next message, or None at EOF (a torn message counts as EOF)."""
    header = stream.read(_HEADER.size)
    if len(header) < _HEADER.size:
        return None
    (size,) = _HEADER.unpack(header)
    data = stream.read(size)
    if len(data) < size:
        return None
    message = pickle.loads(data)
    return message if isinstance(message, tuple) else None
