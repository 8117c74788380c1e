"""What a tracker's training side, its sending worker and its sender process share: the
pump between the training thread and the sender, the counts and their lock, and the framing
of the messages on the sender process's pipes.

The bottom of ``ppe_extensions.tracking``: it imports no other tracking module, so the tracker,
the parent's :class:`~ppe_extensions.tracking._sender.ProcessSender` and the child's loop
(``_child``) all build on it without an import circle.
"""

from __future__ import annotations

import dataclasses
import pickle
import struct
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from typing import IO, Any

__all__ = ["COUNTS_LOCK", "Pump", "TrackerReport", "read_message", "write_message"]

# Counts are updated by the worker, the sender's reader and pump threads; rarely (per batch).
COUNTS_LOCK = threading.Lock()

_HEADER = struct.Struct("!I")


@dataclasses.dataclass(frozen=True)
class TrackerReport:
    """What a tracker did with the entries LogReport emitted (:attr:`BaseTracker.report`).

    ``queued == sent + failed + skipped + unsent``; LogReport handed ``queued + dropped``
    entries to the tracker.

    Attributes:
        queued: Entries handed to the tracker and not dropped.
        sent: Entries the backend accepted.
        dropped: Entries pushed out of the full queue (the oldest waiting) by newer ones.
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


#: The longest pause between two looks of a pump at its queue (seconds): an entry waits at
#: most about ``send_interval`` plus this for its batch.
MAX_LOOK = 0.05
#: The shortest pause (``send_interval=0``): at most 500 looks a second.
MIN_LOOK = 0.002


class Pump:
    """LogReport's entries on their way to a sender: put by the training thread, handed on in
    batches by a pump thread.

    :attr:`put` is a bounded deque's own ``append``, registered as LogReport's entry listener:
    all a tracker does on the training thread is that one C-level call (no Python frame, no
    lock, no wake-up). The pump thread looks at the deque every ``send_interval`` seconds
    (within 2-50 ms) and hands a batch to ``deliver`` when ``batch_size`` entries wait or
    the first of them was seen ``send_interval`` seconds ago, while fewer than two batches
    of delivered entries are unfinished (``finished()``): a slow backend holds at most that
    many, the deque at most ``capacity`` more.

    An entry put into a full deque pushes out the oldest waiting one: the owner counts it as
    dropped (what it put, less :attr:`taken`, less what waits; :meth:`dropped`). Each look
    that finds the deque full calls ``on_full``. After :meth:`close` the pump delivers what
    is left, whatever is in flight, then calls ``deliver(None)`` and stops.
    """

    def __init__(
        self,
        *,
        capacity: int,
        batch_size: int,
        interval: float,
        deliver: Callable[[list[Mapping[str, Any]] | None], None],
        finished: Callable[[], int],
        on_full: Callable[[], None],
        name: str,
    ) -> None:
        self.items: deque[Mapping[str, Any]] = deque(maxlen=capacity)
        self.put: Callable[[Mapping[str, Any]], None] = self.items.append
        # Pump thread only; raised before the entries leave the deque, so a reader on another
        # thread never counts an entry as dropped that is only on its way out.
        self.taken = 0
        self._batch_size = batch_size
        self._interval = interval
        self._look = min(MAX_LOOK, max(MIN_LOOK, interval))
        self._in_flight = 2 * batch_size
        self._deliver = deliver
        self._finished = finished
        self._on_full = on_full
        self._closing = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def dropped(self, put: int) -> int:
        """Entries pushed out of the full deque, of the ``put`` entries put so far.

        Exact once the training thread stopped putting; before, read on that thread, it
        never counts more than were dropped.
        """
        return max(0, put - self.taken - len(self.items))

    def close(self) -> None:
        """Delivers what waits (in batches), then ``None``; returns at once."""
        self._closing.set()

    def join(self, timeout: float | None) -> bool:
        """Waits up to ``timeout`` seconds for the pump to stop; True when it did."""
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def _run(self) -> None:
        items, size = self.items, self._batch_size
        seen_at: float | None = None  # when a look first found the oldest waiting entry
        while not self._closing.wait(self._look):
            count = len(items)
            if count == items.maxlen:
                self._on_full()
            if not count:
                seen_at = None
                continue
            now = time.monotonic()
            # The oldest may have come just after the last look.
            since = now - self._look if seen_at is None else seen_at
            while (
                count
                and (count >= size or now - since >= self._interval)
                and self.taken - self._finished() < self._in_flight
            ):
                self._hand(min(size, count))
                count = len(items)
                since = now
            seen_at = since if count else None
        while items:
            self._hand(min(size, len(items)))
        self._deliver(None)

    def _hand(self, count: int) -> None:
        self.taken += count
        items = self.items
        self._deliver([items.popleft() for _ in range(count)])


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
