"""Profiler state: this process's durations of tagged code sections (``ppe.profiler``).

``ppe.profiler.record`` adds to it and ``ProfileReport`` reports it; it lives below both so the
profiler does not import an extension module.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Iterator

import torch

from ppe_core.reporting import DictSummary

__all__ = ["TimeSummary", "get_time_summary"]


class TimeSummary:
    """Collects durations of tagged code sections, per tag, until they are summarized.

    Thread-safe. Durations are host wall-clock seconds: on accelerators that run
    asynchronously, a section measures the time to issue its work unless it synchronizes.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._summary = DictSummary()

    def add(self, tag: str, seconds: float) -> None:
        """Records one duration of ``tag`` measured elsewhere.

        Args:
            tag: The section's name.
            seconds: Its duration.
        """
        with self._lock:
            self._summary.add({tag: seconds})

    @contextlib.contextmanager
    def report(self, tag: str) -> Iterator[None]:
        """Times the ``with`` block under ``tag`` (also when it raises).

        The block is also a ``torch.profiler.record_function`` range named ``tag``, so it
        shows up in ``torch.profiler`` traces under the same name.

        Args:
            tag: The section's name, e.g. ``'forward'``.
        """
        with torch.profiler.record_function(tag):
            start = time.perf_counter()
            try:
                yield
            finally:
                self.add(tag, time.perf_counter() - start)

    @contextlib.contextmanager
    def summary(self, clear: bool = False) -> Iterator[DictSummary]:
        """Holds the lock and yields the summary of the durations recorded so far.

        Args:
            clear: Start a new, empty summary when the block ends.
        """
        with self._lock:
            try:
                yield self._summary
            finally:
                if clear:
                    self._summary = DictSummary()


_time_summaries: dict[int, TimeSummary] = {}
_time_summaries_lock = threading.Lock()


def get_time_summary() -> TimeSummary:
    """Returns this process's :class:`TimeSummary` (a forked worker gets its own)."""
    pid = os.getpid()
    with _time_summaries_lock:
        summary = _time_summaries.get(pid)
        if summary is None:
            summary = _time_summaries[pid] = TimeSummary()
        return summary
